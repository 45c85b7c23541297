//! `leasehold new`: each language's scaffold builds with its own toolchain (cargo for
//! `wasm32-wasip2`, componentize-py) and passes `leasehold check`; bad names and existing
//! directories are refused.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use leasehold_harness::{componentize_py, guests, output_in};

use crate::harness::{TempDir, deadline, run_leasehold, run_leasehold_within};

/// Runs `cmd` to completion within `limit`; panics with its output unless it succeeds.
fn succeed(what: &str, mut cmd: Command, limit: Duration) -> String {
    cmd.stdin(std::process::Stdio::null());
    let out = output_in(cmd, limit);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

/// `leasehold new NAME --lang LANG` into `tmp/NAME`; panics unless it succeeds.
fn scaffold(tmp: &TempDir, lang: &str, name: &str) -> std::path::PathBuf {
    let dir = tmp.path().join(name);
    let out = run_leasehold(&["new", name, "--lang", lang, "--dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// `leasehold check FILE` succeeds and names the job.
fn assert_checks(wasm: &Path, name: &str) {
    let out = run_leasehold_within(&[Path::new("check"), wasm], Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check refused the scaffold: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("name:") && stdout.contains(name),
        "{stdout}"
    );
}

#[tokio::test]
async fn a_rust_scaffold_builds_and_passes_check() {
    deadline(Duration::from_secs(300), async {
        let tmp = TempDir::new("new-rust");
        let dir = scaffold(&tmp, "rust", "nightly-count");
        // The guests' target directory: wit-bindgen and serde are compiled there already.
        let target = guests()
            .dir()
            .ancestors()
            .nth(2)
            .expect("<target>/wasm32-wasip2/debug")
            .to_path_buf();
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo
            .current_dir(&dir)
            .arg("build")
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTFLAGS");
        succeed(
            "cargo build of the scaffold",
            cargo,
            Duration::from_secs(240),
        );
        assert_checks(
            &target.join("wasm32-wasip2/debug/nightly_count.wasm"),
            "nightly-count",
        );
    })
    .await;
}

/// Builds the Python scaffold in `dir` into `out` with the command its README gives.
fn componentize(dir: &Path, out: &str) {
    let mut build = Command::new(componentize_py());
    build.current_dir(dir).args([
        "-d",
        "wit/job.wit",
        "-w",
        "job",
        "componentize",
        "app",
        "-o",
        out,
    ]);
    succeed(
        &format!("componentize-py on the scaffold into {out}"),
        build,
        Duration::from_secs(180),
    );
}

#[tokio::test]
async fn a_python_scaffold_builds_and_passes_check() {
    deadline(Duration::from_secs(300), async {
        let tmp = TempDir::new("new-python");
        let dir = scaffold(&tmp, "python", "tally");
        componentize(&dir, "tally.wasm");
        assert_checks(&dir.join("tally.wasm"), "tally");

        // A describe() that raises: check names the guest's own exception, not only a wasm
        // backtrace.
        let app = dir.join("app.py");
        let text = std::fs::read_to_string(&app).unwrap();
        let broken = text.replacen(
            "    def describe(self) -> JobSpec:\n",
            "    def describe(self) -> JobSpec:\n        raise TypeError(\"describe broken on purpose\")\n",
            1,
        );
        assert_ne!(broken, text, "the template's describe() was not found");
        std::fs::write(&app, broken).unwrap();
        componentize(&dir, "broken.wasm");
        let out = run_leasehold_within(
            &[Path::new("check"), &dir.join("broken.wasm")],
            Duration::from_secs(180),
        );
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "a describe() that raises passed check: {said}");
        assert!(
            said.contains("describe() failed")
                && said.contains("TypeError: describe broken on purpose"),
            "check does not show the guest's exception: {said}"
        );
    })
    .await;
}

#[test]
fn bad_names_and_existing_directories_are_refused() {
    let tmp = TempDir::new("new-refused");
    let out = run_leasehold(&[
        "new",
        "Bad_Name",
        "--lang",
        "rust",
        "--dir",
        tmp.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Bad_Name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_leasehold(&[
        "new",
        "fine",
        "--lang",
        "python",
        "--dir",
        tmp.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already exists"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
