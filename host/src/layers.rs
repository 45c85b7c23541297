//! The layer rule, checked: every `crate::` path in a file points to its own layer or one
//! below (see the table in `lib.rs`), and no file is longer than [`MAX_LINES`] lines of code
//! (unit tests at its end not counted) unless its module doc has a `Length:` line saying why,
//! and no code outside `store/keys.rs` spells a Redis key (`"lh:…"`).
//!
//! Reading the source is enough: a path that points up is written somewhere as `crate::x`
//! (in a `use`, a grouped `use crate::{…}`, or inline), and comments are skipped.

use std::path::{Path, PathBuf};

/// The line budget of a file's code.
const MAX_LINES: usize = 450;

/// The layer of a module at the crate's root (the first segment after `crate::`).
fn layer(top: &str) -> Option<u8> {
    Some(match top {
        "units" | "setting" | "metrics" | "logging" => 0,
        "store" => 1,
        "coord" => 2,
        "exec" => 3,
        "node" => 4,
        _ => return None,
    })
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("source directory") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate-root modules a line's code (comments cut off) names with `crate::`.
fn targets(line: &str) -> Vec<String> {
    let code = match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c}` on one line: each item's first segment.
            let inner = group.split('}').next().unwrap_or("");
            out.extend(inner.split(',').filter_map(|item| {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            }));
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Violations of the rule in the crate's `src/`, one line each.
fn violations(src: &Path) -> Vec<String> {
    let mut all = Vec::new();
    files(src, &mut all);
    all.sort();
    let mut bad = Vec::new();
    for path in all {
        let rel = path.strip_prefix(src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default()
            .trim_end_matches(".rs");
        let text = std::fs::read_to_string(&path).expect("readable source");
        let code_lines = text
            .lines()
            .position(|l| l.starts_with("#[cfg(test)]"))
            .unwrap_or(text.lines().count());
        if code_lines > MAX_LINES && !text.lines().any(|l| l.starts_with("//! Length:")) {
            bad.push(format!(
                "{}: {code_lines} lines of code (over {MAX_LINES}) and no `//! Length:` line saying why",
                rel.display()
            ));
        }
        // Every Redis key is built in `store/keys.rs`.
        if rel != Path::new("store/keys.rs") && rel != Path::new("layers.rs") {
            for (n, line) in text.lines().take(code_lines).enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("\"lh:") {
                    bad.push(format!(
                        "{}:{}: a Redis key written outside store/keys.rs",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
        // The binary (cli, demo, main) and the crate root sit above every layer.
        let Some(mine) = layer(top) else { continue };
        for (n, line) in text.lines().enumerate() {
            for t in targets(line) {
                match layer(&t) {
                    Some(theirs) if theirs > mine => bad.push(format!(
                        "{}:{}: layer {mine} ({top}) uses crate::{t} (layer {theirs})",
                        rel.display(),
                        n + 1
                    )),
                    Some(_) => {}
                    None if t == "self" || t == "super" => {}
                    None => bad.push(format!(
                        "{}:{}: crate::{t} is in no layer: add it to `layer`",
                        rel.display(),
                        n + 1
                    )),
                }
            }
        }
    }
    bad
}

#[test]
fn imports_run_down_the_layers_files_stay_short_and_keys_come_from_keys_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    assert!(
        bad.is_empty(),
        "the layer rule is broken:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_paths_that_point_up() {
    assert_eq!(
        targets("use crate::exec::runs::{self, JobState};"),
        ["exec"]
    );
    assert_eq!(
        targets("use crate::{coord::term, store}; // crate::node"),
        ["coord", "store"]
    );
    assert_eq!(
        targets("    let x = crate::node::config::show(d); crate::units::show(d)"),
        ["node", "units"]
    );
    assert!(targets("//! see [`crate::node`]").is_empty());
    // A file of layer 2 that names layer 3 is reported.
    let dir = std::env::temp_dir().join(format!("leasehold-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("coord")).unwrap();
    std::fs::write(dir.join("coord/x.rs"), "use crate::exec::runs;\n").unwrap();
    std::fs::write(dir.join("store.rs"), "use crate::units::show;\n").unwrap();
    let bad = violations(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("coord/x.rs:1: layer 2 (coord) uses crate::exec"),
        "{bad:?}"
    );
}
