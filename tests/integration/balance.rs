//! Membership and leadership balancing with real hosts: three replicas of twelve jobs each lead
//! the jobs they are preferred for (weighted rendezvous hashing over the live members), the
//! survivors of a SIGKILL take over every job, and a returning replica gets its jobs back
//! through graceful hand-overs between runs. A run that waits (for its inputs) after a step
//! stays with its component version: the preferred member with another version does not get it
//! until the run is over. Every write stays fenced throughout (the applied history), because
//! balance only decides who campaigns first.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use leasehold::coord::members::{MemberInfo, Members, preferred};
use redis::AsyncCommands;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, http, new_version,
    run_leasehold, run_record, wait_for,
};
use crate::history::Recorder;

const JOBS: usize = 12;
const NODES: [&str; 3] = ["bal-a", "bal-b", "bal-c"];

fn job(i: usize) -> String {
    format!("bal-{i:02}")
}

/// Twelve every-second jobs: one component (the ticker) under twelve names, by sidecars.
fn deploy(jobs: &Path) {
    std::fs::create_dir_all(jobs).unwrap();
    for i in 0..JOBS {
        std::fs::copy(
            guests().wasm("ticker"),
            jobs.join(format!("{}.wasm", job(i))),
        )
        .unwrap();
        std::fs::write(
            jobs.join(format!("{}.toml", job(i))),
            format!("name = \"{}\"\n", job(i)),
        )
        .unwrap();
    }
}

fn membership(nodes: &[&str]) -> Members {
    nodes
        .iter()
        .map(|n| (n.to_string(), MemberInfo::with_capacity(1)))
        .collect()
}

/// Job → the node that should lead it with `nodes` live.
fn expected(nodes: &[&str]) -> BTreeMap<String, String> {
    let m = membership(nodes);
    (0..JOBS)
        .map(|i| (job(i), preferred(&job(i), &m, None).unwrap().to_string()))
        .collect()
}

/// Job → the node whose term holds its lease now.
async fn leaders(redis: &RedisServer) -> BTreeMap<String, String> {
    let mut c = redis.conn().await;
    let mut out = BTreeMap::new();
    for i in 0..JOBS {
        let owner: Option<String> = c.get(format!("lh:{{{}}}:lease", job(i))).await.unwrap();
        if let Some(owner) = owner {
            let node = owner.rsplit_once(':').map(|(n, _)| n).unwrap_or(&owner);
            out.insert(job(i), node.to_string());
        }
    }
    out
}

async fn wait_for_leaders(redis: &RedisServer, want: &BTreeMap<String, String>, what: &str) {
    wait_for(what, Duration::from_secs(60), || async {
        (leaders(redis).await == *want).then_some(())
    })
    .await;
}

fn start(redis: &RedisServer, jobs: &Path, node: &str) -> HostProcess {
    HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        jobs,
        node,
        ("2s", "500ms"),
        &["--http", "127.0.0.1:0"],
    )
}

#[tokio::test]
async fn replicas_lead_their_preferred_jobs_and_hand_them_back_after_a_crash() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("balance");
        let jobs = dir.path().join("jobs");
        deploy(&jobs);
        let recorder = Recorder::start(&redis).await;
        let mut hosts: Vec<HostProcess> = NODES.iter().map(|n| start(&redis, &jobs, n)).collect();
        let all = expected(&NODES);
        // The hash spreads twelve jobs over three members: none is without work.
        for n in NODES {
            assert!(
                all.values().any(|v| v == n),
                "{n} is preferred for no job: {all:?}"
            );
        }
        wait_for_leaders(&redis, &all, "every job led by its preferred member").await;

        // Membership is visible in the status.
        let addr = hosts[0].http_addr(Duration::from_secs(30)).await;
        let (code, status) = http(&addr, "GET", "/v1/status", None).await;
        assert_eq!(code, 200);
        let live: Vec<&str> = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["node"].as_str().unwrap())
            .collect();
        assert_eq!(live, NODES, "{status}");
        let out = run_leasehold(&["status", "--http", &addr]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("members (3 live):"), "{text}");
        for n in NODES {
            assert!(
                text.contains(n),
                "{n} missing from leasehold status:\n{text}"
            );
        }

        // bal-c dies: the survivors take every job, each to its preferred survivor.
        hosts[2].kill();
        let survivors = expected(&NODES[..2]);
        wait_for_leaders(&redis, &survivors, "the survivors leading every job").await;

        // bal-c returns: its jobs come back to it, handed over between runs.
        let before: Vec<usize> = hosts[..2]
            .iter()
            .map(|h| {
                h.log_lines_with("handing over to the job's preferred member")
                    .len()
            })
            .collect();
        hosts[2] = start(&redis, &jobs, NODES[2]);
        wait_for_leaders(&redis, &all, "bal-c leading its jobs again").await;
        let back = all.values().filter(|n| *n == NODES[2]).count();
        let moved = crate::harness::settled(&back, || {
            hosts[..2]
                .iter()
                .zip(&before)
                .map(|(h, b)| {
                    h.log_lines_with("handing over to the job's preferred member")
                        .len()
                        - b
                })
                .sum::<usize>()
        })
        .await;
        assert_eq!(
            moved, back,
            "every job moved back by one graceful hand-over, none more"
        );
        for h in &hosts[..2] {
            assert!(
                h.log_lines_with("stopped leading").is_empty(),
                "a survivor lost a term instead of handing it over: {:?}",
                h.log_lines_with("stopped leading")
            );
        }
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}

#[tokio::test]
async fn a_run_that_never_ends_is_handed_over_between_two_steps() {
    deadline(Duration::from_secs(120), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("balance-steps");
        let (jobs, data) = (dir.path().join("jobs"), dir.path().join("data"));
        // A job whose preferred member of the two is `steps-b`: one 5 ms step after another.
        let two = membership(&["steps-a", "steps-b"]);
        let name = (0..)
            .map(|i| format!("pulse-{i}"))
            .find(|j| preferred(j, &two, None) == Some("steps-b"))
            .unwrap();
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join(&name)).unwrap();
        std::fs::copy(guests().wasm("benchjob"), jobs.join("pulse.wasm")).unwrap();
        std::fs::write(jobs.join("pulse.toml"), format!("name = \"{name}\"\n")).unwrap();
        std::fs::write(data.join(&name).join("mode"), "pulse").unwrap();
        let recorder = Recorder::start(&redis).await;
        let start = |node: &str| {
            HostProcess::start_node(
                LEASEHOLD,
                &redis.url(),
                &jobs,
                node,
                ("2s", "500ms"),
                &["--data-dir", data.to_str().unwrap()],
            )
        };
        let a = start("steps-a");
        wait_for("steps-a to run steps", Duration::from_secs(60), || {
            let n = a.log_lines_with("\"step done\"").len();
            async move { (n >= 3).then_some(()) }
        })
        .await;
        // The preferred member joins: the run moves to it between two steps, and it resumes
        // the run from the checkpoint the last step saved.
        let b = start("steps-b");
        b.wait_for_log("resuming run from its checkpoint", Duration::from_secs(60))
            .await;
        let handed = a.log_lines_with("handing over to the job's preferred member between steps");
        assert_eq!(handed.len(), 1, "{handed:?}");
        assert!(
            a.log_lines_with("stopped leading").is_empty(),
            "the hand-over ended a term by a fault: {:?}",
            a.log_lines_with("stopped leading")
        );
        wait_for("steps-b to run steps", Duration::from_secs(30), || {
            let n = b.log_lines_with("\"step done\"").len();
            async move { (n >= 3).then_some(()) }
        })
        .await;
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}

/// Issue 23, defect 1: a run that is open but deferred (its inputs not ready after a step) was
/// treated as "between runs" and handed to the preferred member without the version check, and
/// failed there with `version-changed`. It is a run in progress: it stays with a host that has
/// its version, finishes there, and only then does the job move.
#[tokio::test]
async fn a_waiting_run_stays_with_its_version_and_the_job_moves_after_it() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("balance-waiting");
        let data = dir.path().join("data");
        let two = membership(&["wait-a", "wait-b"]);
        let name = (0..)
            .map(|i| format!("defer-{i}"))
            .find(|j| preferred(j, &two, None) == Some("wait-b"))
            .unwrap();
        // wait-a serves the stepper as built; wait-b (preferred) serves another version of it.
        let v1 = std::fs::read(guests().wasm("stepper")).unwrap();
        for (jobs, bytes) in [("jobs-a", v1.clone()), ("jobs-b", new_version(&v1, "v2"))] {
            let jobs = dir.path().join(jobs);
            std::fs::create_dir_all(&jobs).unwrap();
            std::fs::write(jobs.join("stepper.wasm"), bytes).unwrap();
            std::fs::write(jobs.join("stepper.toml"), format!("name = \"{name}\"\n")).unwrap();
        }
        let inputs = data.join(&name);
        std::fs::create_dir_all(&inputs).unwrap();
        std::fs::write(inputs.join("defer"), "").unwrap();
        std::fs::write(inputs.join("go-0"), "").unwrap();
        let recorder = Recorder::start(&redis).await;
        let start = |node: &str, jobs: &str| {
            HostProcess::start_node(
                LEASEHOLD,
                &redis.url(),
                &dir.path().join(jobs),
                node,
                ("2s", "500ms"),
                &["--data-dir", data.to_str().unwrap()],
            )
        };
        let a = start("wait-a", "jobs-a");
        // Step 0 done, step 1's input missing: the run waits, open, with wait-a's version.
        let period = wait_for(
            "the run to wait after its first step",
            Duration::from_secs(60),
            || async {
                let records = crate::harness::run_records(&redis, &name).await;
                records
                    .into_iter()
                    .find(|r| r["status"] == "waiting" && r["step"] == 1)
            },
        )
        .await;
        let component = period["component"].as_str().unwrap().to_string();
        let period = period["period"].as_str().unwrap().to_string();
        let _b = start("wait-b", "jobs-b");
        // wait-b asks for the job; wait-a keeps it, saying why. (Before the fix it handed the
        // job over and wait-b failed the run with version-changed.)
        wait_for(
            "wait-a to keep the waiting run",
            Duration::from_secs(60),
            || async {
                let record = run_record(&redis, &name, &period).await.unwrap();
                assert_ne!(
                    record["status"], "failed",
                    "the waiting run was handed over: {record}"
                );
                (!a.log_lines_with("keeping the job instead of handing it to its preferred member")
                    .is_empty())
                .then_some(())
            },
        )
        .await;
        let kept =
            a.log_lines_with("keeping the job instead of handing it to its preferred member");
        assert!(
            kept[0].contains(&component) && kept[0].contains("wait-b"),
            "{kept:?}"
        );
        assert!(
            a.log_lines_with("handing over to the job's preferred member")
                .is_empty(),
            "{:?}",
            a.log_lines_with("handing over")
        );
        // The inputs arrive: the run finishes on wait-a with the version it started with.
        std::fs::write(inputs.join("go-1"), "").unwrap();
        std::fs::write(inputs.join("go-2"), "").unwrap();
        let done = wait_for("the run to be done", Duration::from_secs(90), || async {
            let r = run_record(&redis, &name, &period).await.unwrap();
            assert_ne!(r["status"], "failed", "{r}");
            (r["status"] == "done").then_some(r)
        })
        .await;
        assert_eq!(done["component"], component.as_str(), "{done}");
        assert_eq!(done["node"], "wait-a", "{done}");
        // With no run open, the job moves to its preferred member.
        wait_for(
            "wait-b to lead the job",
            Duration::from_secs(60),
            || async {
                let owner: Option<String> = redis
                    .conn()
                    .await
                    .get(format!("lh:{{{name}}}:lease"))
                    .await
                    .unwrap();
                owner.filter(|o| o.starts_with("wait-b:"))
            },
        )
        .await;
        recorder.check().unwrap_or_else(|v| panic!("{v}"));
    })
    .await;
}
