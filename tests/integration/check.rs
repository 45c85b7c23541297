//! `leasehold check` and loading: every kind of bad file is refused with a message naming the
//! file and the reason, and a host keeps serving its other jobs.

use std::time::Duration;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, run_leasehold,
};

/// Runs `leasehold check FILE` (30 s deadline): exit code, stdout and stderr.
fn check(file: &std::path::Path) -> (i32, String, String) {
    check_with(file, &[])
}

/// [`check`] with more arguments.
fn check_with(file: &std::path::Path, more: &[&str]) -> (i32, String, String) {
    let mut args = vec![std::ffi::OsStr::new("check"), file.as_os_str()];
    args.extend(more.iter().map(std::ffi::OsStr::new));
    let out = run_leasehold(&args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_valid_job_prints_its_spec() {
    let (code, out, err) = check(&guests().wasm("reconciliation"));
    assert_eq!(code, 0, "{err}");
    for needle in [
        "is a valid leasehold job",
        "name:       reconciliation",
        "schedule:   0 30 2 * * * (Europe/London)",
        "memory:     512 MiB",
        "quota:      100000 keys, 256 MiB",
        "component:  sha256:",
        "world:      leasehold:job@0.4.3 (fan-out-job)",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
}

/// A job's sidecar beside the file: `check` shows the databases it asks for (and under which
/// of the host's names) and the HTTP destinations it is granted; without one, the databases the
/// job declares.
#[test]
fn check_shows_the_databases_and_destinations_a_sidecar_grants() {
    let dir = TempDir::new("check-grants");
    let file = dir.join("sqlprobe.wasm");
    std::fs::copy(guests().wasm("sqlprobe"), &file).unwrap();
    std::fs::write(
        dir.join("sqlprobe.toml"),
        "[sql.databases]\nledger = \"ledger\"\naccounting = \"books\"\n[http]\nallow = [\"https://pay.example.com\"]\n",
    )
    .unwrap();
    let (code, out, err) = check(&file);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "sidecar:    ",
        "databases:  accounting (the host's books), ledger",
        "http:       https://pay.example.com",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
    // Without a sidecar: the database the probe declares (its `databases` export), by its name.
    std::fs::remove_file(dir.join("sqlprobe.toml")).unwrap();
    let (code, out, err) = check(&file);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.trim() == "databases:  ledger"),
        "{out}"
    );
    // A sidecar that maps it elsewhere, with a name no host could have: refused, naming it.
    std::fs::write(
        dir.join("sqlprobe.toml"),
        "[sql.databases]\nledger = \"Books!\"\n",
    )
    .unwrap();
    let (code, _, err) = check(&file);
    assert_eq!(code, 1);
    assert!(err.contains("database name \"Books!\" must be"), "{err}");
}

#[test]
fn bad_files_are_refused_with_the_file_and_the_reason() {
    let dir = TempDir::new("check");
    let real = std::fs::read(guests().wasm("reconciliation")).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "notes.wasm",
            b"these are not the bytes you are looking for".to_vec(),
            "not a WebAssembly file",
        ),
        (
            "core.wasm",
            b"\0asm\x01\0\0\0".to_vec(),
            "a core WebAssembly module, not a component",
        ),
        (
            "truncated.wasm",
            real[..real.len() / 2].to_vec(),
            "not a valid component",
        ),
    ];
    for (name, bytes, reason) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let (code, _, err) = check(&path);
        assert_eq!(code, 1, "{name}: {err}");
        assert!(
            err.contains(&format!("{} is refused: {reason}", path.display())),
            "{name}: {err}"
        );
    }
    let (code, _, err) = check(&dir.join("missing.wasm"));
    assert_eq!(code, 1);
    assert!(
        err.contains("missing.wasm is refused: cannot read"),
        "{err}"
    );
    let (code, _, err) = check(&guests().wasm("otherworld"));
    assert_eq!(code, 1);
    assert!(
        err.contains("is refused: does not implement the leasehold:job/job@0.4.3 world"),
        "{err}"
    );
    // A huge file is refused unread (sparse: it takes no disk space).
    let huge = dir.join("huge.wasm");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(100 << 20).unwrap();
    let (code, _, err) = check(&huge);
    assert_eq!(code, 1);
    assert!(
        err.contains("huge.wasm is refused: larger than the host's max-component-size of 64 MiB"),
        "{err}"
    );
}

/// A component that imports `wasi:sockets` (as every componentize-py component does) loads:
/// the sockets it could ask for are refused at run time (`containment.rs`).
#[test]
fn a_component_importing_sockets_is_a_valid_job() {
    let (code, out, err) = check(&guests().wasm("netjob"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("name:       netjob"), "{out}");
}

/// The instance, table and memory counts are host limits: a component over one is refused
/// before it is compiled, naming the flag that raises it.
#[test]
fn instance_table_and_memory_counts_are_limits_with_flags() {
    let billing = guests().wasm("billing");
    let started = std::time::Instant::now();
    let (code, _, err) = check_with(&billing, &["--max-instances", "1"]);
    let took = started.elapsed();
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("billing.wasm is refused: creates ")
            && err.contains(" core instances; the host allows 1 (--max-instances raises it)"),
        "{err}"
    );
    eprintln!("refused before compiling in {took:?} (the process included)");
    let (code, _, err) = check_with(&billing, &["--max-tables", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("tables; the host allows 1 (--max-tables raises it)"),
        "{err}"
    );
    let (code, _, err) = check_with(&billing, &["--max-instances", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("max-instances (0) must be between 1 and 10000"),
        "{err}"
    );
}

#[tokio::test]
async fn a_host_refuses_a_bad_job_and_serves_the_others() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("bad-job");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(guests().wasm("otherworld"), jobs.join("otherworld.wasm")).unwrap();
        std::fs::write(jobs.join("broken.wasm"), b"not wasm").unwrap();
        std::fs::copy(
            guests().wasm("reconciliation"),
            jobs.join("reconciliation.wasm"),
        )
        .unwrap();
        let host =
            HostProcess::start_node(LEASEHOLD, &redis.url(), &jobs, "n1", ("1s", "200ms"), &[]);
        let led = host
            .wait_for_log("became leader", Duration::from_secs(60))
            .await;
        assert!(led.contains("\"job\":\"reconciliation\""), "{led}");
        // Jobs load in the background, each on its own: a refusal may be logged after another
        // job already leads.
        for (file, reason) in [
            ("otherworld.wasm", "does not implement"),
            ("broken.wasm", "not a WebAssembly file"),
        ] {
            host.wait_for_log_matching(
                &format!("{file} refused: {reason}"),
                Duration::from_secs(30),
                |l| l.contains("refused") && l.contains(file) && l.contains(reason),
            )
            .await;
        }
    })
    .await;
}

#[test]
fn check_applies_the_host_limits_it_is_given() {
    let ticker = guests().wasm("ticker");
    let out = run_leasehold(&[
        std::ffi::OsStr::new("check"),
        ticker.as_os_str(),
        std::ffi::OsStr::new("--max-memory"),
        std::ffi::OsStr::new("16MiB"),
        std::ffi::OsStr::new("--max-step-time"),
        std::ffi::OsStr::new("5s"),
        std::ffi::OsStr::new("--max-stored-keys"),
        std::ffi::OsStr::new("50"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The ticker is built to the previous world, 0.2.0, which the host still loads.
    for needle in [
        "memory:     16 MiB",
        "step time:  5s",
        "write size: 1 MiB",
        "quota:      50 keys, 256 MiB",
        "world:      leasehold:job@0.2.0",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    let (code, _, _) = check(&ticker);
    assert_eq!(code, 0);
    let small = run_leasehold(&[
        std::ffi::OsStr::new("check"),
        ticker.as_os_str(),
        std::ffi::OsStr::new("--max-component-size"),
        std::ffi::OsStr::new("64KiB"),
        std::ffi::OsStr::new("--max-memory"),
        std::ffi::OsStr::new("1000"),
    ]);
    assert_eq!(small.status.code(), Some(1));
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(
        err.contains("max-memory (1000 bytes) must be at least 1 MiB"),
        "{err}"
    );
    let refused = run_leasehold(&[
        std::ffi::OsStr::new("check"),
        ticker.as_os_str(),
        std::ffi::OsStr::new("--max-component-size"),
        std::ffi::OsStr::new("64KiB"),
    ]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("larger than the host's max-component-size of 64 KiB"),
        "{err}"
    );
}

/// Replays the fuzz corpus (`host/fuzz/corpus/load`) through the load path: every input ends
/// in a job or a refusal with a reason, never a panic.
#[tokio::test]
async fn the_fuzz_corpus_loads_or_is_refused_without_panicking() {
    deadline(Duration::from_secs(120), async {
        let corpus = crate::harness::repo_root().join("host/fuzz/corpus/load");
        let runtime =
            leasehold::exec::runtime::Runtime::new(leasehold::exec::spec::HostLimits::default())
                .unwrap();
        let (mut loaded, mut refused) = (0, 0);
        for entry in std::fs::read_dir(&corpus).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            match runtime.load_bytes(&path, bytes).await {
                Ok(job) => {
                    assert!(!job.spec.name.is_empty());
                    loaded += 1;
                }
                Err(e) => {
                    assert_eq!(e.path, path);
                    assert!(!e.reason.is_empty(), "{}: empty reason", path.display());
                    refused += 1;
                }
            }
        }
        // The seeds include a valid job and several kinds of bad file.
        assert!(
            loaded >= 1 && refused >= 4,
            "loaded {loaded}, refused {refused}"
        );
    })
    .await;
}

#[tokio::test]
async fn check_reads_and_fills_the_compiled_code_cache() {
    deadline(Duration::from_secs(120), async {
        let dir = TempDir::new("check-cache");
        let cache = dir.path().join("cache");
        let cache_arg = cache.to_str().unwrap();
        let ticker = guests().wasm("ticker");
        let (code, out, err) = check_with(&ticker, &["--cache-dir", cache_arg]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("compiled:   yes: compiled now and stored in the cache in"),
            "{out}"
        );
        let entries: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .collect();
        assert_eq!(
            entries.len(),
            1,
            "one compiled entry in {}",
            cache.display()
        );
        let (code, out, err) = check_with(&ticker, &["--cache-dir", cache_arg]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("compiled:   no: loaded from the cache in"),
            "{out}"
        );
        let (code, out, err) = check_with(&ticker, &["--no-cache"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("compiled:   yes: compiled now (no cache)"),
            "{out}"
        );
        // A host with the same cache loads what check compiled without compiling it.
        let redis = RedisServer::start().await;
        let jobs = dir.path().join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(&ticker, jobs.join("ticker.wasm")).unwrap();
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &jobs,
            "n1",
            ("2s", "500ms"),
            &["--cache-dir", cache_arg],
        );
        let line = host
            .wait_for_log("loaded job", Duration::from_secs(60))
            .await;
        assert!(line.contains("\"compiled\":\"cached\""), "{line}");
    })
    .await;
}
