//! `leasehold new --lang rust|python [--fan-out] NAME`: a new job's project directory, ready to
//! build and pass `leasehold check`; with `--fan-out`, a job of the `fan-out-job` world whose
//! runs hand tasks to every replica.
//!
//! Every scaffold carries the job world this binary loads (`wit/job.wit`); the Rust one also
//! carries the guest SDK (`leasehold-guest/`, the same crate as `guest-jobs/sdk`), so it builds
//! outside this repository with nothing but crates.io. The templates live in `templates/` at
//! the repository's root and are compiled into the binary; `{{name}}` stands for the job's name.

use std::path::{Path, PathBuf};

use leasehold::exec::spec::validate_job_name;

use super::args::Lang;

/// The job world, as this binary loads it.
const WORLD: &str = include_str!("../../../wit/job.wit");

/// Files of the Python scaffold: path in the project → template.
const PYTHON: &[(&str, &str)] = &[
    ("app.py", include_str!("../../../templates/python/app.py")),
    (
        "README.md",
        include_str!("../../../templates/python/README.md"),
    ),
];

/// What `--fan-out` puts in place of the Python scaffold's files of the same path.
const PYTHON_FAN_OUT: &[(&str, &str)] = &[
    (
        "app.py",
        include_str!("../../../templates/python-fan-out/app.py"),
    ),
    (
        "README.md",
        include_str!("../../../templates/python-fan-out/README.md"),
    ),
];

/// What `--fan-out` puts in place of the Rust scaffold's files of the same path.
const RUST_FAN_OUT: &[(&str, &str)] = &[
    (
        "src/lib.rs",
        include_str!("../../../templates/rust-fan-out/lib.rs"),
    ),
    (
        "README.md",
        include_str!("../../../templates/rust-fan-out/README.md"),
    ),
];

/// Files of the Rust scaffold: path in the project → template.
const RUST: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../templates/rust/Cargo.toml"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../../../templates/rust/config.toml"),
    ),
    ("src/lib.rs", include_str!("../../../templates/rust/lib.rs")),
    (
        "README.md",
        include_str!("../../../templates/rust/README.md"),
    ),
    (
        "leasehold-guest/Cargo.toml",
        include_str!("../../../templates/rust/sdk-Cargo.toml"),
    ),
    (
        "leasehold-guest/src/lib.rs",
        include_str!("../../../guest-jobs/sdk/src/lib.rs"),
    ),
    (
        "leasehold-guest/src/job.rs",
        include_str!("../../../guest-jobs/sdk/src/job.rs"),
    ),
    (
        "leasehold-guest/wit/job.wit",
        include_str!("../../../guest-jobs/sdk/wit/job.wit"),
    ),
    (
        "leasehold-guest/src/error.rs",
        include_str!("../../../guest-jobs/sdk/src/error.rs"),
    ),
    (
        "leasehold-guest/src/http.rs",
        include_str!("../../../guest-jobs/sdk/src/http.rs"),
    ),
    (
        "leasehold-guest/src/json.rs",
        include_str!("../../../guest-jobs/sdk/src/json.rs"),
    ),
    (
        "leasehold-guest/src/spec.rs",
        include_str!("../../../guest-jobs/sdk/src/spec.rs"),
    ),
    (
        "leasehold-guest/src/state.rs",
        include_str!("../../../guest-jobs/sdk/src/state.rs"),
    ),
];

/// `leasehold new`: writes the project and says how to build and check it.
pub(crate) fn new_job(
    lang: Lang,
    fan_out: bool,
    name: &str,
    dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let files = scaffold(lang, fan_out, name, &dir)?;
    let world = if fan_out { "fan-out-job" } else { "job" };
    println!("created {} ({} files)", dir.display(), files.len());
    for f in &files {
        println!("  {}", f.display());
    }
    match lang {
        Lang::Rust => println!(
            "build:  cd {} && cargo build --release --target wasm32-wasip2\ncheck:  leasehold check {}/target/wasm32-wasip2/release/{}.wasm",
            dir.display(),
            dir.display(),
            name.replace('-', "_")
        ),
        Lang::Python => println!(
            "build:  cd {} && componentize-py -d wit/job.wit -w {world} componentize app -o {name}.wasm\ncheck:  leasehold check {}/{name}.wasm",
            dir.display(),
            dir.display()
        ),
    }
    Ok(())
}

/// Creates `dir` (which must not exist) with a job named `name` in `lang`, a fan-out job when
/// `fan_out`; returns the files written.
pub(crate) fn scaffold(
    lang: Lang,
    fan_out: bool,
    name: &str,
    dir: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    validate_job_name(name)?;
    if dir.exists() {
        anyhow::bail!(
            "{} already exists: leasehold new writes a new directory only",
            dir.display()
        );
    }
    let (base, fanned) = match lang {
        Lang::Python => (PYTHON, PYTHON_FAN_OUT),
        Lang::Rust => (RUST, RUST_FAN_OUT),
    };
    let mut files: Vec<(String, String)> = base
        .iter()
        .map(
            |&(path, text)| match fanned.iter().find(|(p, _)| *p == path) {
                Some(&(_, fan)) if fan_out => (path, fan),
                _ => (path, text),
            },
        )
        .map(|(path, text)| {
            // The SDK is copied as it is (it carries its own copy of the world, `wit/job.wit`).
            let text = if path.starts_with("leasehold-guest/") {
                text.to_string()
            } else {
                text.replace("{{name_snake}}", &name.replace('-', "_"))
                    .replace("{{name}}", name)
            };
            (path.to_string(), text)
        })
        .collect();
    files.push(("wit/job.wit".into(), WORLD.to_string()));
    let mut written = Vec::new();
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
