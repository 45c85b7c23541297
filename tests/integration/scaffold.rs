//! `leasehold new`: each language's scaffold builds with its own toolchain (cargo for
//! `wasm32-wasip2`, componentize-py) and passes `leasehold check`, the fan-out ones too, and a
//! Python fan-out job built from its scaffold alone survives a kill of its leader mid-run with
//! the right count; bad names and existing directories are refused.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use leasehold_harness::{componentize_py, guests, output_in};

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, run_leasehold, run_leasehold_within,
    run_record, trigger, wait_for,
};

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
    scaffold_with(tmp, lang, name, &[])
}

/// [`scaffold`] with `extra` flags (`--fan-out`).
fn scaffold_with(tmp: &TempDir, lang: &str, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let dir = tmp.path().join(name);
    let mut args = vec!["new", name, "--lang", lang, "--dir", dir.to_str().unwrap()];
    args.extend(extra);
    let out = run_leasehold(&args);
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

/// Builds the Rust scaffold in `dir` with cargo (in the guests' target directory, where
/// wit-bindgen and serde are compiled already); the component's path.
fn cargo_build(dir: &Path, crate_name: &str) -> std::path::PathBuf {
    let target = guests()
        .dir()
        .ancestors()
        .nth(2)
        .expect("<target>/wasm32-wasip2/debug")
        .to_path_buf();
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(dir)
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
    target.join(format!("wasm32-wasip2/debug/{crate_name}.wasm"))
}

#[tokio::test]
async fn a_rust_scaffold_builds_and_passes_check() {
    deadline(Duration::from_secs(300), async {
        let tmp = TempDir::new("new-rust");
        let dir = scaffold(&tmp, "rust", "nightly-count");
        assert_checks(&cargo_build(&dir, "nightly_count"), "nightly-count");
    })
    .await;
}

/// Builds the Python scaffold in `dir` into `out` with the command its README gives.
fn componentize(dir: &Path, out: &str) {
    componentize_world(dir, "job", out);
}

/// [`componentize`] to `world` (`fan-out-job`).
fn componentize_world(dir: &Path, world: &str, out: &str) {
    let mut build = Command::new(componentize_py());
    build.current_dir(dir).args([
        "-d",
        "wit/job.wit",
        "-w",
        world,
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

#[tokio::test]
async fn a_rust_fan_out_scaffold_builds_and_passes_check() {
    deadline(Duration::from_secs(300), async {
        let tmp = TempDir::new("new-rust-fan");
        let dir = scaffold_with(&tmp, "rust", "nightly-split", &["--fan-out"]);
        assert_checks(&cargo_build(&dir, "nightly_split"), "nightly-split");
    })
    .await;
}

/// The Python fan-out scaffold, built with the command its README gives and nothing else,
/// on three replicas. The first runs no tasks (`--task-slots 0`), so its run is sure to be
/// waiting for them when it is SIGKILLed; the two others, started only after the kill, take
/// the run over, run its tasks and finish it once, with the count of every line.
#[tokio::test]
async fn a_python_fan_out_scaffold_survives_a_kill_of_its_leader() {
    const JOB: &str = "price-check";
    const PERIOD: &str = "2026-05-01";
    const LINES: usize = 5000;
    deadline(Duration::from_secs(300), async {
        let tmp = TempDir::new("new-python-fan");
        let dir = scaffold_with(&tmp, "python", JOB, &["--fan-out"]);
        componentize_world(&dir, "fan-out-job", "job.wasm");
        assert_checks(&dir.join("job.wasm"), JOB);

        let redis = RedisServer::start().await;
        let (jobs, data) = (tmp.path().join("jobs"), tmp.path().join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join(JOB)).unwrap();
        let csv: String = (0..LINES)
            .map(|i| format!("sku-{i},{}\n", 100 + i))
            .collect();
        std::fs::write(data.join(format!("{JOB}/input.csv")), csv).unwrap();
        // The scaffold's daily fire time is skipped unless the host sees it within a second:
        // run within the catch-up window after it (02:00 UTC), the day's own run would wait for
        // tasks that n0 never runs, and the triggered period would queue behind it.
        std::fs::write(
            jobs.join(format!("{JOB}.toml")),
            "[catch-up]\npolicy = \"skip\"\nwindow = \"1s\"\n",
        )
        .unwrap();
        std::fs::copy(dir.join("job.wasm"), jobs.join(format!("{JOB}.wasm"))).unwrap();
        let data_flag = data.to_str().unwrap();
        let start = |node: &str, slots: &[&str]| {
            let mut args = vec!["--data-dir", data_flag];
            args.extend(slots);
            HostProcess::start_node(LEASEHOLD, &redis.url(), &jobs, node, ("2s", "500ms"), &args)
        };
        let mut first = start("n0", &["--task-slots", "0"]);
        first
            .wait_for_log("became leader", Duration::from_secs(120))
            .await;
        trigger(&redis, JOB, PERIOD);
        wait_for(
            "the run to wait for its tasks",
            Duration::from_secs(60),
            || async {
                run_record(&redis, JOB, PERIOD)
                    .await
                    .filter(|r| r["awaiting_tasks"] == true)
            },
        )
        .await;
        // Killed before the others start: started first, they would take the tasks at once and
        // the leader could finish the run before it is killed (CI saw it).
        first.kill();
        let _others = [start("n1", &[]), start("n2", &[])];
        let done = wait_for("the run to be done", Duration::from_secs(90), || async {
            run_record(&redis, JOB, PERIOD)
                .await
                .filter(|r| r["status"] == "done" || r["status"] == "failed")
        })
        .await;
        assert_eq!(done["status"], "done", "{done}");
        let count: String = redis::AsyncCommands::get(
            &mut redis.conn().await,
            format!("lh:{{{JOB}}}:data:count/{PERIOD}"),
        )
        .await
        .unwrap();
        assert_eq!(count, LINES.to_string());
        assert_ne!(done["node"], "n0", "the killed leader finished the run");
        assert_eq!(done["attempt"], 1, "{done}");
    })
    .await;
}
