//! What a component declares, read from its bytes without compiling it (wasmparser): its
//! top-level imports and exports, and how many core instances, tables and memories it creates.
//! A component the host can never run is refused from this in milliseconds, before a compile
//! that takes seconds for a large one; what it cannot tell (types) is checked after compiling.

use wasmparser::{ComponentTypeRef, Encoding, Instance, Parser, Payload};

use crate::exec::spec::Counts;

/// The WASI 0.2 packages the linker offers (`wasi:http` sends only what the job is granted, and
/// `wasi:sockets` refuses every operation: see `load.rs`).
const WASI_PACKAGES: [&str; 7] = [
    "cli",
    "clocks",
    "filesystem",
    "io",
    "random",
    "sockets",
    "http",
];
/// The versions of the job world the host loads.
pub(super) const JOB_WORLDS: [&str; 6] = ["0.4.3", "0.4.2", "0.4.1", "0.4.0", "0.3.0", "0.2.0"];

/// A component's declarations.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Shape {
    /// Top-level import names (`wasi:cli/environment@0.2.0`, `leasehold:job/store@0.3.0`).
    pub imports: Vec<String>,
    /// Top-level export names (`describe`, `run-step`).
    pub exports: Vec<String>,
    /// Core module instantiations, in this component and the components it nests.
    pub instances: u32,
    /// Tables defined by its core modules.
    pub tables: u32,
    /// Linear memories defined by its core modules.
    pub memories: u32,
}

/// Reads `bytes` (a component: the caller checked the header).
pub(super) fn inspect(bytes: &[u8]) -> Result<Shape, String> {
    let mut shape = Shape::default();
    // Nesting: one entry per module or component being read; the first is the top level.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid component: {e}"))?;
        match payload {
            Payload::Version { encoding, .. } => {
                depth += 1;
                if depth == 1 && encoding != Encoding::Component {
                    return Err("not a component".into());
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a valid component: {e}"))?;
                    // A type import (`job-spec`: a name for a type of an imported interface)
                    // needs nothing from the host.
                    if !matches!(import.ty, ComponentTypeRef::Type(_)) {
                        shape.imports.push(import.name.name.to_string());
                    }
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| format!("not a valid component: {e}"))?;
                    shape.exports.push(export.name.name.to_string());
                }
            }
            Payload::InstanceSection(reader) => {
                for instance in reader {
                    let instance = instance.map_err(|e| format!("not a valid component: {e}"))?;
                    if matches!(instance, Instance::Instantiate { .. }) {
                        shape.instances += 1;
                    }
                }
            }
            Payload::TableSection(reader) => shape.tables += reader.count(),
            Payload::MemorySection(reader) => shape.memories += reader.count(),
            _ => {}
        }
    }
    Ok(shape)
}

impl Shape {
    /// Why the host can never run this component, if it cannot: an import it does not offer,
    /// exports other than the job world's, or more instances, tables or memories than the
    /// host's limits (naming the flag that raises each).
    pub(super) fn refusal(&self, counts: Counts) -> Option<String> {
        let missing: Vec<&str> = ["describe", "run-step"]
            .into_iter()
            .filter(|e| !self.exports.iter().any(|x| x == e))
            .collect();
        if !missing.is_empty() {
            let world = JOB_WORLDS
                .into_iter()
                .find(|v| {
                    self.imports
                        .iter()
                        .any(|i| i.starts_with("leasehold:job/") && i.ends_with(&format!("@{v}")))
                })
                .unwrap_or(JOB_WORLDS[0]);
            return Some(format!(
                "does not implement the leasehold:job/job@{world} world: it does not export {} (its exports: {})",
                missing.join(" or "),
                if self.exports.is_empty() {
                    "none".to_string()
                } else {
                    self.exports.join(", ")
                }
            ));
        }
        let foreign: Vec<&str> = self
            .imports
            .iter()
            .map(String::as_str)
            .filter(|i| !offered(i))
            .collect();
        if !foreign.is_empty() {
            return Some(format!(
                "imports {}, which the host does not offer (it offers WASI 0.2 and leasehold:job@{})",
                foreign.join(", "),
                JOB_WORLDS.join(", @")
            ));
        }
        for (what, n, max, flag) in [
            (
                "core instances",
                self.instances,
                counts.instances,
                "--max-instances",
            ),
            ("tables", self.tables, counts.tables, "--max-tables"),
            ("memories", self.memories, counts.memories, "--max-memories"),
        ] {
            if n > max {
                return Some(format!(
                    "creates {n} {what}; the host allows {max} ({flag} raises it)"
                ));
            }
        }
        None
    }
}

/// Whether the host's linker offers import `name`.
fn offered(name: &str) -> bool {
    let Some((path, version)) = name.split_once('@') else {
        return false;
    };
    if let Some(interface) = path.strip_prefix("wasi:") {
        let package = interface.split('/').next().unwrap_or("");
        return WASI_PACKAGES.contains(&package) && version.starts_with("0.2.");
    }
    path.starts_with("leasehold:job/") && JOB_WORLDS.contains(&version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: u32) -> Counts {
        Counts {
            instances: n,
            tables: n,
            memories: n,
        }
    }

    fn job(imports: &[&str]) -> Shape {
        Shape {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            exports: vec!["describe".into(), "run-step".into()],
            instances: 5,
            tables: 2,
            memories: 3,
        }
    }

    #[test]
    fn offered_imports_are_wasi_0_2_and_the_job_worlds() {
        for ok in [
            "wasi:cli/environment@0.2.0",
            "wasi:sockets/tcp@0.2.3",
            "wasi:http/outgoing-handler@0.2.0",
            "leasehold:job/store@0.3.0",
            "leasehold:job/types@0.2.0",
        ] {
            assert_eq!(job(&[ok]).refusal(counts(64)), None, "{ok}");
        }
        for bad in [
            "wasi:cli/environment@0.3.0",
            "wasi:keyvalue/store@0.2.0",
            "leasehold:job/store@0.1.0",
            "other:clock/now@1.0.0",
            "log-it",
        ] {
            let why = job(&[bad]).refusal(counts(64)).unwrap();
            assert!(why.starts_with(&format!("imports {bad}, which")), "{why}");
        }
    }

    #[test]
    fn counts_over_the_limits_name_the_flag() {
        assert_eq!(
            job(&[]).refusal(counts(4)).unwrap(),
            "creates 5 core instances; the host allows 4 (--max-instances raises it)"
        );
        let memories = Counts {
            memories: 2,
            ..counts(64)
        };
        assert_eq!(
            job(&[]).refusal(memories).unwrap(),
            "creates 3 memories; the host allows 2 (--max-memories raises it)"
        );
    }

    #[test]
    fn a_component_without_the_world_exports_is_named_as_such() {
        let shape = Shape {
            exports: vec!["greet".into()],
            ..Shape::default()
        };
        assert_eq!(
            shape.refusal(counts(64)).unwrap(),
            "does not implement the leasehold:job/job@0.4.3 world: it does not export describe or run-step (its exports: greet)"
        );
    }
}
