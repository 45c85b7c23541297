//! Fan-out: a job's leader hands tasks to every replica (the `tasker` fixture, see
//! `guest-jobs/tasker`), with real hosts. Tasks run on every replica; a worker killed or frozen
//! mid-task has its task taken over, and a frozen worker's late result is never seen; a leader
//! killed while tasks run is replaced by one that collects them; a task that traps is retried,
//! then fails the run with its message; a run that fails while its tasks are mid-write ends
//! them (issue 23, defect 2). In process: the task scripts refuse a result of an older term, of
//! a worker whose claim was taken over, and a second result, and every write of a task whose
//! run has ended or was run again.

use std::time::Duration;

use leasehold::coord::fence::{self, Bookkeeping, FenceError, Refusal, TermWrite};
use leasehold::coord::lease::{self, Acquired};
use leasehold::coord::terms::TermEnd;
use leasehold::exec::tasks::{self, Attempt, Completed, RunOf, Submitted};
use leasehold::store::keys::JobKeys;
use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::{
    HostProcess, LEASEHOLD, RedisServer, TempDir, conn, deadline, guests, http, run_leasehold,
    wait_for,
};
use crate::history::{History, Recorder};

/// The tasker's current period (its schedule fires once a year, pinned to 2026 by its sidecar,
/// [`crate::harness::PINNED_TO_2026`]; a leader runs it at once).
const PERIOD: &str = "2026-01-01";
const JOB: &str = "tasker";

struct FanOut {
    _dir: TempDir,
    redis: RedisServer,
    hosts: Vec<HostProcess>,
    recorder: Recorder,
    tasks: u64,
}

impl FanOut {
    /// `n` hosts of the tasker with `config` as its `/data/tasker.json`, TTL 1 s.
    async fn start(name: &str, n: usize, config: Value) -> Self {
        Self::start_with(name, n, config, None).await
    }

    /// [`FanOut::start`], with `sidecar` as the job's `tasker.toml` when given.
    async fn start_with(name: &str, n: usize, config: Value, sidecar: Option<&str>) -> Self {
        Self::start_on(RedisServer::start().await, name, n, config, sidecar).await
    }

    /// [`FanOut::start`] with the job paused: its run starts only once [`FanOut::resume`] is
    /// called, when every host has loaded it (so every worker is there from the first task).
    async fn start_paused(name: &str, n: usize, config: Value) -> Self {
        let redis = RedisServer::start().await;
        let out = run_leasehold(&["pause", JOB, "--redis-url", &redis.url()]);
        assert!(out.status.success(), "{out:?}");
        let f = Self::start_on(redis, name, n, config, None).await;
        for h in &f.hosts {
            h.wait_for_log("\"loaded job\"", Duration::from_secs(60))
                .await;
        }
        f
    }

    /// Resumes the job [`FanOut::start_paused`] paused.
    fn resume(&self) {
        let out = run_leasehold(&["resume", JOB, "--redis-url", &self.redis.url()]);
        assert!(out.status.success(), "{out:?}");
    }

    async fn start_on(
        redis: RedisServer,
        name: &str,
        n: usize,
        config: Value,
        sidecar: Option<&str>,
    ) -> Self {
        let dir = tasker_dir(name, &config, sidecar);
        let recorder = Recorder::start(&redis).await;
        let hosts = (0..n)
            .map(|i| {
                tasker_host(
                    &redis,
                    &dir,
                    &format!("w{i}"),
                    ("1s", "200ms"),
                    "2",
                    &["--http", "127.0.0.1:0"],
                )
            })
            .collect();
        FanOut {
            _dir: dir,
            redis,
            hosts,
            recorder,
            tasks: config["tasks"].as_u64().unwrap_or(8),
        }
    }

    async fn record(&self) -> Option<Value> {
        crate::harness::run_record(&self.redis, JOB, PERIOD).await
    }

    async fn wait_final(&self, status: &str, limit: Duration) -> Value {
        wait_for(&format!("the run to be {status}"), limit, || async {
            self.record().await.filter(|r| r["status"] == status)
        })
        .await
    }

    /// The host whose log has a line with `needle` (waits up to `limit`), skipping `except`.
    async fn host_logging(&self, needle: &str, except: &[usize], limit: Duration) -> usize {
        wait_for(&format!("a host to log {needle:?}"), limit, || {
            let found = (0..self.hosts.len())
                .filter(|i| !except.contains(i))
                .find(|i| !self.hosts[*i].log_lines_with(needle).is_empty());
            async move { found }
        })
        .await
    }

    /// The host leading the job now.
    async fn leader(&self) -> usize {
        wait_for("a leader", Duration::from_secs(60), || async {
            let owner: Option<String> = self
                .redis
                .conn()
                .await
                .get(format!("lh:{{{JOB}}}:lease"))
                .await
                .ok()?;
            owner?.strip_prefix('w')?.split(':').next()?.parse().ok()
        })
        .await
    }

    /// The sum the run wrote, which must be Σ i² over the tasks.
    async fn assert_sum(&self) {
        let sum: Option<String> = self
            .redis
            .conn()
            .await
            .get(format!("lh:{{{JOB}}}:data:sum/{PERIOD}"))
            .await
            .unwrap();
        let want: u64 = (0..self.tasks).map(|i| i * i).sum();
        assert_eq!(sum, Some(want.to_string()), "the run's sum");
    }

    /// The history is fenced, holds one `done`, and every task's output was accepted once.
    fn assert_history(&self) -> History {
        let history = self
            .recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        assert_eq!(
            history.done_records(JOB, PERIOD).len(),
            1,
            "one done record"
        );
        let data = format!("lh:{{{JOB}}}:taskdata:{PERIOD}");
        for i in 0..self.tasks {
            let outputs = history
                .applied
                .iter()
                .filter(|a| a.key == data && a.value == format!("o:t-{i}"))
                .count();
            assert_eq!(outputs, 1, "output of t-{i} accepted {outputs} times");
        }
        history
    }

    /// Lines logging a task event among every host's.
    fn count(&self, needle: &str) -> usize {
        self.hosts
            .iter()
            .map(|h| h.log_lines_with(needle).len())
            .sum()
    }
}

/// A directory with the tasker in `jobs/` (its `tasker.toml`: the schedule pinned to 2026, then
/// `sidecar`) and `config` as
/// its `data/tasker/tasker.json`.
fn tasker_dir(name: &str, config: &Value, sidecar: Option<&str>) -> TempDir {
    let dir = TempDir::new(name);
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    std::fs::create_dir_all(dir.join("data/tasker")).unwrap();
    std::fs::copy(guests().wasm("tasker"), dir.join("jobs/tasker.wasm")).unwrap();
    std::fs::write(
        dir.join("jobs/tasker.toml"),
        format!(
            "{}{}",
            crate::harness::PINNED_TO_2026,
            sidecar.unwrap_or_default()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("data/tasker/tasker.json"), config.to_string()).unwrap();
    dir
}

/// A host `node` on the tasker in `dir`, with `slots` task slots, `(ttl, heartbeat)` and
/// `extra` flags.
fn tasker_host(
    redis: &RedisServer,
    dir: &TempDir,
    node: &str,
    timing: (&str, &str),
    slots: &str,
    extra: &[&str],
) -> HostProcess {
    let data = dir.join("data");
    let mut args = vec!["--data-dir", data.to_str().unwrap(), "--task-slots", slots];
    args.extend_from_slice(extra);
    HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        &dir.join("jobs"),
        node,
        timing,
        &args,
    )
}

#[tokio::test]
async fn tasks_run_on_every_replica_and_their_outputs_make_the_result() {
    deadline(Duration::from_secs(180), async {
        // Paused until every replica has loaded the job: a replica still compiling it when the
        // run starts would leave every task to the others.
        let f = FanOut::start_paused(
            "fanout",
            3,
            serde_json::json!({"tasks": 12, "spin_ms": 500}),
        )
        .await;
        f.resume();
        let record = f.wait_final("done", Duration::from_secs(120)).await;
        assert_eq!(record["step"], 2, "{record}");
        // Every task's guest ended before its result (and so the run) was recorded: each node
        // shows its own worker idle at once, not as of its last registration.
        for (i, h) in f.hosts.iter().enumerate() {
            let addr = h.http_addr(Duration::from_secs(30)).await;
            let (_, status) = http(&addr, "GET", "/v1/status", None).await;
            let me = status["members"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["node"] == format!("w{i}")).cloned())
                .unwrap_or_default();
            assert_eq!(me["tasks"]["running"], 0, "w{i} after the run: {status}");
        }
        f.assert_sum().await;
        f.assert_history();
        let workers = crate::harness::settled(&true, || {
            f.hosts
                .iter()
                .filter(|h| !h.log_lines_with("\"task done\"").is_empty())
                .count()
                >= 2
        })
        .await;
        assert!(workers, "tasks ran on fewer than two hosts");
        // Every worker is visible in the status: slots, tasks done, last heartbeat.
        let addr = f.hosts[0].http_addr(Duration::from_secs(30)).await;
        let done: u64 = wait_for("the workers' figures", Duration::from_secs(10), || async {
            let (_, status) = http(&addr, "GET", "/v1/status", None).await;
            let members = status["members"].as_array()?.clone();
            let total: u64 = members
                .iter()
                .map(|m| m["tasks"]["done"].as_u64().unwrap_or(0))
                .sum();
            (members.len() == 3
                && members.iter().all(|m| {
                    m["tasks"]["slots"] == 2 && m["seen"].as_str().is_some_and(|s| !s.is_empty())
                })
                && total >= f.tasks)
                .then_some(total)
        })
        .await;
        assert!(done >= f.tasks);
        let out = run_leasehold(&["status", "--http", &addr]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("tasks: 2 slots"), "{text}");
        let (_, metrics) = http(&addr, "GET", "/metrics", None).await;
        let metrics = metrics.as_str().unwrap_or_default().to_string();
        assert!(
            metrics
                .contains("leasehold_task_duration_seconds_count{job=\"tasker\",outcome=\"done\"}")
                || f.hosts[0].log_lines_with("\"task done\"").is_empty(),
            "no task duration in the metrics of a host that ran tasks"
        );
    })
    .await;
}

#[tokio::test]
async fn a_killed_workers_task_is_taken_over_and_run_again() {
    deadline(Duration::from_secs(180), async {
        let mut f = FanOut::start(
            "fanout-kill",
            3,
            serde_json::json!({"tasks": 6, "spin_ms": 3000}),
        )
        .await;
        let leader = f.leader().await;
        let worker = f
            .host_logging("\"task started\"", &[leader], Duration::from_secs(60))
            .await;
        // While the run waits, `runs` and the HTTP API show its tasks: states, attempts and the
        // workers running them.
        let url = f.redis.url();
        let tasks = wait_for(
            "the waiting run's tasks in `runs --json`",
            Duration::from_secs(30),
            || async {
                let out = run_leasehold(&["runs", JOB, "--json", "--redis-url", &url]);
                let line = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .next()?
                    .to_string();
                let r: Value = serde_json::from_str(&line).ok()?;
                let tasks = r["tasks"].as_array()?.clone();
                tasks
                    .iter()
                    .any(|t| {
                        t["state"] == "running"
                            && t["worker"].as_str().is_some_and(|w| w.starts_with('w'))
                    })
                    .then_some(tasks)
            },
        )
        .await;
        assert_eq!(tasks.len() as u64, f.tasks, "{tasks:?}");
        assert!(
            tasks.iter().all(|t| t["attempt"].as_u64() >= Some(1)),
            "{tasks:?}"
        );
        let out = run_leasehold(&["runs", JOB, "--redis-url", &url]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(table.contains(&format!("  {} tasks: ", f.tasks)), "{table}");
        assert!(table.contains("running"), "{table}");
        let addr = f.hosts[leader].http_addr(Duration::from_secs(30)).await;
        let (_, body) = http(&addr, "GET", "/v1/jobs/tasker/runs", None).await;
        assert!(
            body["runs"][0]["tasks"]
                .as_array()
                .is_some_and(|t| t.len() as u64 == f.tasks),
            "{body}"
        );
        // And `status` (HTTP and CLI): the open run, with its tasks by state.
        let (_, status) = http(&addr, "GET", "/v1/status", None).await;
        let open = &status["jobs"][0]["open_runs"][0];
        assert_eq!(open["period"], PERIOD, "{status}");
        assert_eq!(open["tasks"]["total"].as_u64(), Some(f.tasks), "{status}");
        let out = run_leasehold(&["status", "--http", &addr]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("open run {PERIOD} waiting"))
                && text.contains(&format!("; {} tasks: ", f.tasks)),
            "{text}"
        );
        f.hosts[worker].kill();
        f.wait_final("done", Duration::from_secs(120)).await;
        // A finished run has no tasks left to show.
        let out = run_leasehold(&["runs", JOB, "--redis-url", &url]);
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(!table.contains(" tasks: "), "{table}");
        f.assert_sum().await;
        f.assert_history();
        assert!(
            f.count("took over a task whose worker stopped answering") >= 1,
            "no task was taken over from the killed worker"
        );
    })
    .await;
}

#[tokio::test]
async fn a_frozen_workers_late_result_is_never_seen() {
    deadline(Duration::from_secs(180), async {
        let f = FanOut::start(
            "fanout-freeze",
            3,
            serde_json::json!({"tasks": 6, "spin_ms": 2000}),
        )
        .await;
        let leader = f.leader().await;
        let worker = f
            .host_logging("\"task started\"", &[leader], Duration::from_secs(60))
            .await;
        // Frozen past its claim (TTL 1 s): another worker takes its tasks over and finishes
        // them; then it wakes.
        f.hosts[worker].pause();
        wait_for(
            "another worker to take the frozen one's task over",
            Duration::from_secs(60),
            || {
                let n = (0..3)
                    .filter(|i| *i != worker)
                    .map(|i| {
                        f.hosts[i]
                            .log_lines_with("took over a task whose worker stopped answering")
                            .len()
                    })
                    .sum::<usize>();
                async move { (n >= 1).then_some(()) }
            },
        )
        .await;
        f.wait_final("done", Duration::from_secs(120)).await;
        f.hosts[worker].resume();
        let late = wait_for(
            "the frozen worker to drop or have refused its late result",
            Duration::from_secs(30),
            || {
                let n = f.hosts[worker].log_lines_with("output dropped").len()
                    + f.hosts[worker].log_lines_with("task result refused").len();
                async move { (n >= 1).then_some(n) }
            },
        )
        .await;
        assert!(late >= 1);
        f.assert_sum().await;
        // Every output was accepted exactly once: the late one never was.
        f.assert_history();
    })
    .await;
}

#[tokio::test]
async fn a_new_leader_collects_the_tasks_its_predecessor_submitted() {
    deadline(Duration::from_secs(180), async {
        let mut f = FanOut::start(
            "fanout-leader",
            3,
            serde_json::json!({"tasks": 6, "spin_ms": 2000}),
        )
        .await;
        let leader = f.leader().await;
        f.hosts[leader]
            .wait_for_log("waiting for the run's tasks", Duration::from_secs(60))
            .await;
        f.hosts[leader].kill();
        let record = f.wait_final("done", Duration::from_secs(120)).await;
        assert_ne!(record["node"], format!("w{leader}"), "{record}");
        f.assert_sum().await;
        f.assert_history();
        // Nothing was submitted twice: one submission added every task.
        let added = crate::harness::settled(&f.tasks, || {
            f.hosts
                .iter()
                .flat_map(|h| h.log_lines_with("\"tasks submitted\""))
                .filter_map(|l| serde_json::from_str::<Value>(&l).ok()?["added"].as_u64())
                .sum::<u64>()
        })
        .await;
        assert_eq!(added, f.tasks, "tasks added by submissions");
        // The new leader took over the tasks still running (they ran again under its term).
        assert_eq!(f.count("took over the run's unfinished tasks"), 1);
    })
    .await;
}

#[tokio::test]
async fn a_task_that_traps_is_retried_then_fails_the_run_with_its_message() {
    deadline(Duration::from_secs(180), async {
        let f = FanOut::start(
            "fanout-trap",
            2,
            serde_json::json!({"tasks": 4, "fail": ["t-2"]}),
        )
        .await;
        let record = f.wait_final("failed", Duration::from_secs(120)).await;
        assert_eq!(record["failure"], "task-failed", "{record}");
        let error = record["error"].as_str().unwrap();
        assert!(
            error.contains("task t-2 failed on all of its 3 attempts")
                && error.contains("task t-2 exploded"),
            "{error}"
        );
        assert_eq!(f.count("task attempt failed; queued again"), 2);
        // Each attempt after a failure waits out a back-off (1 s, then 2 s: no retry policy).
        assert_eq!(f.count("queued again, to run in 1s"), 1);
        assert_eq!(f.count("queued again, to run in 2s"), 1);
        assert!(f.count("task waits out its back-off before it runs") >= 1);
        // The failed run's tasks are gone with it.
        let mut c = f.redis.conn().await;
        let left: bool = c
            .exists(format!("lh:{{{JOB}}}:task:{PERIOD}"))
            .await
            .unwrap();
        assert!(!left, "the failed run's task records were kept");
    })
    .await;
}

/// Issue 23, defect 2: a task's `store` writes were checked against the term and the claim
/// only, so a task of a run that had already failed (or finished) kept writing. Now the run's
/// end ends its tasks: the run fails on its maximum run time while every task is mid-write, and
/// no task write is applied after the failed record; the workers say why they stopped.
#[tokio::test]
async fn a_run_that_fails_while_its_tasks_write_ends_them() {
    deadline(Duration::from_secs(120), async {
        let f = FanOut::start_with(
            "fanout-ended",
            2,
            serde_json::json!({"tasks": 2, "spin_ms": 60000, "write_every_ms": 50}),
            Some("max-run-time = \"3s\"\n"),
        )
        .await;
        let record = f.wait_final("failed", Duration::from_secs(60)).await;
        assert_eq!(record["failure"], "run-timeout", "{record}");
        // Both tasks stop at their next write or claim refresh, and say why.
        let stopped = |f: &FanOut| {
            f.hosts
                .iter()
                .map(|h| h.log_lines_with("run has ended").len())
                .sum::<usize>()
        };
        wait_for("both tasks to stop", Duration::from_secs(30), || {
            let n = stopped(&f);
            async move { (n >= 2).then_some(()) }
        })
        .await;
        let history = f
            .recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        let run_key = format!("lh:{{{JOB}}}:run:{PERIOD}");
        let failed_at = history
            .applied
            .iter()
            .find(|a| a.key == run_key && a.value.contains("\"status\":\"failed\""))
            .map(|a| a.at)
            .expect("the failed record in the history");
        let ticks = format!("lh:{{{JOB}}}:data:tick/{PERIOD}/");
        let before = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&ticks) && a.at < failed_at)
            .count();
        assert!(
            before >= 2,
            "the tasks were not writing before the run ended"
        );
        let late: Vec<_> = history
            .applied
            .iter()
            .filter(|a| a.key.starts_with(&ticks) && a.at > failed_at)
            .collect();
        assert!(
            late.is_empty(),
            "task writes applied after the run failed: {late:?}"
        );
        // The stream holds nothing of the ended run for a worker to fetch or keep claiming.
        let mut c = f.redis.conn().await;
        let pending: Vec<redis::Value> = redis::cmd("XPENDING")
            .arg(format!("lh:{{{JOB}}}:tasks"))
            .arg(tasks::GROUP)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            pending[0],
            redis::Value::Int(0),
            "entries still pending: {pending:?}"
        );
    })
    .await;
}

/// A task's `store` write of `value` to its key `tick`, as the term `term` under `claim`.
async fn task_write(
    c: &mut leasehold::store::Conn,
    keys: &JobKeys,
    term: (&str, u64),
    claim: &tasks::Claim,
    value: &str,
) -> Result<fence::Written, FenceError> {
    let sets = [(keys.data("tick"), value.as_bytes())];
    let write = TermWrite {
        claim: Some(claim),
        ..TermWrite::new(&sets, &[])
    };
    fence::unchecked::invoke(c, keys, term, &write).await
}

/// The scripts' side of defect 2, in process: a task's write is refused once its run has
/// ended, and once the period was run again (a new attempt's tasks), with the reason; the
/// run's end acknowledges and deletes its queued entries.
#[tokio::test]
async fn a_task_of_an_ended_or_rerun_run_changes_nothing() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = conn(&redis).await;
        let keys = JobKeys::new("ended-tasks");
        let ttl = Duration::from_secs(10);
        let Acquired::Granted { token } = lease::acquire(&mut c, &keys, "a:1", ttl).await.unwrap()
        else {
            panic!("not granted")
        };
        let term = ("a:1", token);
        let run = |attempt| RunOf {
            period: "p".into(),
            attempt,
            scheduled_at: String::new(),
            component: "sha256:x".into(),
        };
        let two = [
            ("t-1".to_string(), b"one".to_vec()),
            ("t-2".to_string(), b"two".to_vec()),
        ];
        tasks::submit(&mut c, &keys, term, &run(1), &two, u64::MAX)
            .await
            .unwrap();
        let old = tasks::fetch(&mut c, &keys, "w1:x", ttl, 1)
            .await
            .unwrap()
            .remove(0);
        assert_eq!((old.claim.run, old.claim.id.as_str()), (1, "t-1"));
        // Mid-run the task writes.
        task_write(&mut c, &keys, term, &old.claim, "1")
            .await
            .unwrap();
        // The run ends (a final record): its tasks end with it.
        let period = ["p".to_string()];
        let end = TermWrite::new(&[], &[]).with(Bookkeeping {
            open_remove: &period,
            end_tasks: Some("p"),
            ..Bookkeeping::default()
        });
        let deletes = [keys.task_runs("p"), keys.task_data("p")];
        let end = TermWrite {
            deletes: &deletes,
            ..end
        };
        fence::unchecked::invoke(&mut c, &keys, term, &end)
            .await
            .unwrap();
        let late = task_write(&mut c, &keys, term, &old.claim, "2").await;
        assert!(
            matches!(&late, Err(FenceError::Refused(Refusal::RunEnded { task })) if task == "t-1"),
            "{late:?}"
        );
        assert!(late.unwrap_err().to_string().contains("run has ended"));
        assert_eq!(
            tasks::refresh(&mut c, &keys, &old.claim).await.unwrap(),
            tasks::Held::RunEnded
        );
        let out = Attempt::Output(b"late".to_vec());
        let done = tasks::complete(&mut c, &keys, &old, &out, 3, Duration::ZERO, u64::MAX)
            .await
            .unwrap();
        assert!(
            matches!(done, Completed::Refused(Refusal::RunEnded { .. })),
            "{done:?}"
        );
        // Nothing of the ended run is left in the stream: t-2, never fetched, is gone too.
        let len: u64 = redis::cmd("XLEN")
            .arg(keys.tasks())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(len, 0);
        assert!(
            tasks::fetch(&mut c, &keys, "w2:y", Duration::ZERO, 5)
                .await
                .unwrap()
                .is_empty()
        );
        // The period is run again as attempt 2: the old attempt's task is still refused, the
        // new attempt's task writes.
        tasks::submit(&mut c, &keys, term, &run(2), &two[..1], u64::MAX)
            .await
            .unwrap();
        let late = task_write(&mut c, &keys, term, &old.claim, "3").await;
        assert!(
            matches!(late, Err(FenceError::Refused(Refusal::RunEnded { .. }))),
            "{late:?}"
        );
        let new = tasks::fetch(&mut c, &keys, "w2:y", ttl, 1)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(new.claim.run, 2);
        task_write(&mut c, &keys, term, &new.claim, "4")
            .await
            .unwrap();
        assert_eq!(
            tasks::refresh(&mut c, &keys, &new.claim).await.unwrap(),
            tasks::Held::Yes
        );
        let v: String = c.get(keys.data("tick")).await.unwrap();
        assert_eq!(v, "4");
    })
    .await;
}

#[tokio::test]
async fn task_results_are_fenced_by_the_submitting_term_and_the_workers_claim() {
    deadline(Duration::from_secs(30), async {
        let redis = RedisServer::start().await;
        let mut c = conn(&redis).await;
        let keys = JobKeys::new("fenced-tasks");
        let ttl = Duration::from_secs(10);
        let grant = |a| match a {
            Acquired::Granted { token } => token,
            other => panic!("not granted: {other:?}"),
        };
        let a = grant(lease::acquire(&mut c, &keys, "a:1", ttl).await.unwrap());
        let run = RunOf {
            period: "p".into(),
            attempt: 1,
            scheduled_at: String::new(),
            component: "sha256:x".into(),
        };
        let one = [("t-1".to_string(), b"payload".to_vec())];
        assert_eq!(
            tasks::submit(&mut c, &keys, ("a:1", a), &run, &one, u64::MAX)
                .await
                .unwrap(),
            Submitted::Added(1)
        );
        // Submitted again (a step re-executed): nothing added.
        assert_eq!(
            tasks::submit(&mut c, &keys, ("a:1", a), &run, &one, u64::MAX)
                .await
                .unwrap(),
            Submitted::Added(0)
        );
        // A run's bound: a submission that would take it past MOST_PER_RUN adds nothing.
        let mut rounds = 0;
        loop {
            let batch: Vec<(String, Vec<u8>)> = (0..tasks::MOST_PER_SUBMIT)
                .map(|i| (format!("m-{rounds}-{i}"), Vec::new()))
                .collect();
            match tasks::submit(&mut c, &keys, ("a:1", a), &run, &batch, u64::MAX)
                .await
                .unwrap()
            {
                Submitted::Added(n) => assert_eq!(n as usize, tasks::MOST_PER_SUBMIT),
                Submitted::TooMany(has) => {
                    assert_eq!(has as usize, 1 + rounds * tasks::MOST_PER_SUBMIT);
                    assert!(has as usize + tasks::MOST_PER_SUBMIT > tasks::MOST_PER_RUN as usize);
                    break;
                }
                other => panic!("no quota here: {other:?}"),
            }
            rounds += 1;
            assert!(rounds <= 10, "never refused");
        }
        let p = tasks::progress(&mut c, &keys, "p").await.unwrap();
        assert!(p.submitted <= tasks::MOST_PER_RUN, "{p:?}");
        // Start again with a run of one task.
        let _: () = redis::cmd("DEL")
            .arg(keys.task_runs("p"))
            .arg(keys.task_data("p"))
            .arg(keys.tasks())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            tasks::submit(&mut c, &keys, ("a:1", a), &run, &one, u64::MAX)
                .await
                .unwrap(),
            Submitted::Added(1)
        );
        let first = tasks::fetch(&mut c, &keys, "w1:x", ttl, 1).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].token, a);
        // A new term begins: the old term's result is refused, and a submit of the old term too.
        assert!(
            lease::release(&mut c, &keys, "a:1", TermEnd::Released)
                .await
                .unwrap()
        );
        let b = grant(lease::acquire(&mut c, &keys, "b:1", ttl).await.unwrap());
        let out = Attempt::Output(b"old".to_vec());
        let late = tasks::complete(&mut c, &keys, &first[0], &out, 3, Duration::ZERO, u64::MAX)
            .await
            .unwrap();
        assert!(
            matches!(late, Completed::Refused(Refusal::Stale { .. })),
            "{late:?}"
        );
        let old_submit = tasks::submit(&mut c, &keys, ("a:1", a), &run, &one, u64::MAX).await;
        assert!(matches!(old_submit, Err(FenceError::Refused(_))));
        // The new term takes the task over: a new entry of its own.
        assert_eq!(
            tasks::adopt(&mut c, &keys, ("b:1", b), "p").await.unwrap(),
            1
        );
        let mine = tasks::fetch(&mut c, &keys, "w1:x", ttl, 1).await.unwrap();
        assert_eq!(mine[0].token, b);
        // Another worker takes the claim over (as after the first stopped answering).
        let theirs = tasks::fetch(&mut c, &keys, "w2:y", Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(theirs.len(), 1);
        assert!(theirs[0].reclaimed);
        assert_eq!(theirs[0].claim.deliveries, 2);
        let zombie = tasks::complete(&mut c, &keys, &mine[0], &out, 3, Duration::ZERO, u64::MAX)
            .await
            .unwrap();
        assert!(
            matches!(zombie, Completed::Refused(Refusal::ClaimLost { .. })),
            "{zombie:?}"
        );
        let good = Attempt::Output(b"new".to_vec());
        assert_eq!(
            tasks::complete(
                &mut c,
                &keys,
                &theirs[0],
                &good,
                3,
                Duration::ZERO,
                u64::MAX
            )
            .await
            .unwrap(),
            Completed::Done
        );
        // A second result for the task is refused; the first stays.
        let again = tasks::complete(&mut c, &keys, &theirs[0], &out, 3, Duration::ZERO, u64::MAX)
            .await
            .unwrap();
        assert!(matches!(again, Completed::Refused(_)), "{again:?}");
        assert_eq!(
            tasks::output(&mut c, &keys, "p", "t-1").await.unwrap(),
            Some(b"new".to_vec())
        );
        let p = tasks::progress(&mut c, &keys, "p").await.unwrap();
        assert_eq!((p.submitted, p.finished, p.failed), (1, 1, 0));
    })
    .await;
}

#[tokio::test]
async fn a_fanned_out_reconciliation_writes_exactly_the_sequential_report() {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("fanout-recon");
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        // One component as two jobs, on the same generated day: one sequential, one fanned out
        // in three parts (its data directory asks for it).
        for job in ["recon-seq", "recon-fan"] {
            std::fs::copy(
                guests().wasm("reconciliation"),
                jobs.join(format!("{job}.wasm")),
            )
            .unwrap();
            std::fs::write(
                jobs.join(format!("{job}.toml")),
                format!("name = \"{job}\"\n"),
            )
            .unwrap();
            leasehold_harness::fixtures::write_generated_day(&data, job, "2026-11-27", 20_000, 3)
                .unwrap();
        }
        std::fs::write(data.join("recon-fan/fan-out"), "3").unwrap();
        let recorder = Recorder::start(&redis).await;
        let hosts: Vec<HostProcess> = (0..2)
            .map(|i| {
                HostProcess::start_node(
                    LEASEHOLD,
                    &redis.url(),
                    &jobs,
                    &format!("r{i}"),
                    ("2s", "400ms"),
                    &["--data-dir", data.to_str().unwrap()],
                )
            })
            .collect();
        for job in ["recon-seq", "recon-fan"] {
            crate::harness::trigger(&redis, job, "2026-11-27");
        }
        for job in ["recon-seq", "recon-fan"] {
            wait_for(
                &format!("{job} to be done"),
                Duration::from_secs(180),
                || async {
                    crate::harness::run_record(&redis, job, "2026-11-27")
                        .await
                        .filter(|r| r["status"] == "done")
                },
            )
            .await;
        }
        let fan = crate::harness::run_record(&redis, "recon-fan", "2026-11-27")
            .await
            .unwrap();
        // Submit and await; put the parts' fragments together; delete them.
        assert_eq!(fan["step"], 3, "the fanned-out run is three steps: {fan}");
        // Every report key of the fanned-out run holds the sequential run's bytes.
        let mut c = redis.conn().await;
        let names = |job: &str| format!("lh:{{{job}}}:data:report/*");
        let mut seq: Vec<String> = c.keys(names("recon-seq")).await.unwrap();
        let mut fanned: Vec<String> = c.keys(names("recon-fan")).await.unwrap();
        seq.sort();
        fanned.sort();
        assert_eq!(
            seq.iter()
                .map(|k| k.replace("recon-seq", ""))
                .collect::<Vec<_>>(),
            fanned
                .iter()
                .map(|k| k.replace("recon-fan", ""))
                .collect::<Vec<_>>()
        );
        assert!(seq.len() > 4, "{seq:?}");
        for (s, f) in seq.iter().zip(&fanned) {
            let (a, b): (Vec<u8>, Vec<u8>) = (c.get(s).await.unwrap(), c.get(f).await.unwrap());
            assert!(a == b, "{f} differs from {s}");
        }
        // Its parts ran as tasks, fenced; the run's task records left with it. Each part's
        // outcome was recorded by a worker that says so, or by one whose answer was lost (it
        // warns; the run could not have finished without the record).
        let ran = crate::harness::settled(&3, || {
            hosts
                .iter()
                .flat_map(|h| {
                    let mut lines = h.log_lines_with("\"task done\"");
                    lines.extend(h.log_lines_with("no answer recording the task's outcome"));
                    lines
                })
                .filter_map(|l| {
                    let at = l.find("\"task\":\"")? + "\"task\":\"".len();
                    l[at..].split('"').next().map(str::to_string)
                })
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        })
        .await;
        assert_eq!(ran, 3, "every part's outcome recorded");
        recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        let left: bool = c.exists("lh:{recon-fan}:task:2026-11-27").await.unwrap();
        assert!(!left);
        // The tasks wrote their parts' fragments (each task's log says how many), and the last
        // step deleted every one. A part may have run twice (a worker whose answer recording
        // its outcome was lost under load: another took the task over); every part ran.
        let parts = crate::harness::settled(&3, || {
            hosts
                .iter()
                .flat_map(|h| h.log_lines_with("fragments written"))
                .filter_map(|l| {
                    let at = l.find(": part ")? + ": part ".len();
                    l[at..].split(' ').next().map(str::to_string)
                })
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        })
        .await;
        assert_eq!(parts, 3, "every part wrote its fragments");
        let fragments: Vec<String> = c.keys("lh:{recon-fan}:data:fan/*").await.unwrap();
        assert!(fragments.is_empty(), "{fragments:?}");
    })
    .await;
}

#[tokio::test]
async fn a_task_whose_workers_keep_dying_counts_as_a_failed_attempt() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let config = serde_json::json!({"tasks": 2, "spin_ms": 100});
        let dir = tasker_dir("fanout-deliveries", &config, None);
        let host =
            |node: &str, slots: &str| tasker_host(&redis, &dir, node, ("1s", "200ms"), slots, &[]);
        // A leader that runs no task: the run's tasks wait in the stream.
        let leader = host("w0", "0");
        leader
            .wait_for_log("waiting for the run's tasks", Duration::from_secs(60))
            .await;
        // A worker takes them and dies, again and again: as if delivered four times already.
        let keys = JobKeys::new(JOB);
        let mut c = redis.conn().await;
        // XREADGROUP's reply: [[stream, [[id, [field, value, …]], …]]].
        type Entries = Vec<(String, Vec<(String, Vec<String>)>)>;
        let read: Entries = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(tasks::GROUP)
            .arg("ghost")
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS")
            .arg(keys.tasks())
            .arg(">")
            .query_async(&mut c)
            .await
            .unwrap();
        let ids: Vec<String> = read[0].1.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(ids.len(), 2, "{ids:?}");
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(keys.tasks())
            .arg(tasks::GROUP)
            .arg("ghost")
            .arg(0)
            .arg(&ids)
            .arg("RETRYCOUNT")
            .arg(4)
            .query_async(&mut c)
            .await
            .unwrap();
        // A live worker finds the lapsed claims: each delivery is counted as a failed attempt,
        // queued again as the next attempt, which it runs.
        let worker = host("w1", "2");
        let record = wait_for("the run to finish", Duration::from_secs(120), || async {
            crate::harness::run_record(&redis, JOB, PERIOD)
                .await
                .filter(|r| r["status"] == "done" || r["status"] == "failed")
        })
        .await;
        assert_eq!(record["status"], "done", "{record}");
        let capped =
            worker.log_lines_with("\"message\":\"the task was delivered 4 times and every worker");
        assert_eq!(capped.len(), 2, "{capped:?}");
        assert_eq!(
            worker
                .log_lines_with("task attempt failed; queued again")
                .len(),
            2
        );
        drop(leader);
    })
    .await;
}

#[tokio::test]
async fn a_task_that_is_not_ready_runs_again_as_the_same_attempt() {
    deadline(Duration::from_secs(180), async {
        // With a retry policy, its back-off is the job's (300 ms here).
        let f = FanOut::start_with(
            "fanout-not-ready",
            2,
            serde_json::json!({"tasks": 3, "not_ready_once": ["t-1"]}),
            Some("[retry]\nattempts = 2\nbackoff = \"300ms\"\n"),
        )
        .await;
        let record = f.wait_final("done", Duration::from_secs(120)).await;
        assert_eq!(record["step"], 2, "{record}");
        f.assert_sum().await;
        assert_eq!(
            f.count("task not ready; queued again as the same attempt, to run in 300ms"),
            1
        );
        // Not a failed attempt: nothing retried, and t-1 ran again as attempt 1.
        assert_eq!(f.count("task attempt failed"), 0);
        let started_t1 = || -> Vec<Value> {
            f.hosts
                .iter()
                .flat_map(|h| h.log_lines_with("\"task started\""))
                .filter_map(|l| serde_json::from_str(&l).ok())
                .filter(|v: &Value| v["task"] == "t-1")
                .collect()
        };
        crate::harness::settled(&2, || started_t1().len()).await;
        let started = started_t1();
        assert_eq!(started.len(), 2, "{started:?}");
        assert!(started.iter().all(|v| v["attempt"] == 1), "{started:?}");
    })
    .await;
}

/// The job's storage count (keys, bytes) as its writes and tasks left it.
async fn usage(redis: &RedisServer) -> (u64, u64) {
    let mut c = redis.conn().await;
    let (k, b): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(JobKeys::new(JOB).usage())
        .arg("keys")
        .arg("bytes")
        .query_async(&mut c)
        .await
        .unwrap();
    (k.unwrap_or(0), b.unwrap_or(0))
}

#[tokio::test]
async fn task_payloads_and_outputs_count_against_the_quota_while_their_run_keeps_them() {
    deadline(Duration::from_secs(180), async {
        // Counted while the run waits for its tasks, taken off when it ends: afterwards the
        // count is what the job's own keys hold (a recount from the keys agrees).
        let f = FanOut::start(
            "fanout-quota",
            2,
            serde_json::json!({"tasks": 4, "spin_ms": 1500}),
        )
        .await;
        let during = wait_for(
            "tasks counted in the usage",
            Duration::from_secs(60),
            || async {
                let r = f.record().await?;
                let (_, bytes) = usage(&f.redis).await;
                (r["status"] == "waiting" && bytes > 0).then_some(bytes)
            },
        )
        .await;
        f.wait_final("done", Duration::from_secs(120)).await;
        let after = usage(&f.redis).await;
        let out = run_leasehold(&["purge", JOB, "--recount", "--redis-url", &f.redis.url()]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            usage(&f.redis).await,
            after,
            "the run's task bytes were left in the count"
        );
        assert!(during > 0);
        drop(f);

        // Payloads that would take the job past its quota: nothing is submitted, and the run
        // fails as quota-exceeded, naming the tasks.
        let f = FanOut::start_with(
            "fanout-quota-refused",
            1,
            serde_json::json!({"tasks": 40}),
            Some("[quota]\nbytes = \"1KiB\"\n"),
        )
        .await;
        let record = f.wait_final("failed", Duration::from_secs(120)).await;
        assert_eq!(record["failure"], "quota-exceeded", "{record}");
        let error = record["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("task payloads count against the storage quota"),
            "{error}"
        );
        let mut c = f.redis.conn().await;
        let left: bool = c
            .exists(format!("lh:{{{JOB}}}:taskdata:{PERIOD}"))
            .await
            .unwrap();
        assert!(!left, "a refused submission stored payloads");
        assert_eq!(usage(&f.redis).await.1, 0, "{record}");
    })
    .await;
}

#[tokio::test]
async fn a_stopping_worker_gives_its_task_back_at_once() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let config = serde_json::json!({"tasks": 2, "spin_ms": 4000});
        let dir = tasker_dir("fanout-give-back", &config, None);
        // A long lease (30 s): a claim left to lapse would be taken over only after it.
        let host =
            |node: &str, slots: &str| tasker_host(&redis, &dir, node, ("30s", "1s"), slots, &[]);
        let leader = host("w0", "0");
        leader
            .wait_for_log("\"became leader\"", Duration::from_secs(60))
            .await;
        let mut workers = [host("w1", "2"), host("w2", "2")];
        let first = wait_for("a worker to start a task", Duration::from_secs(60), || {
            let i = workers
                .iter()
                .position(|w| !w.log_lines_with("\"task started\"").is_empty());
            async move { i }
        })
        .await;
        let other = 1 - first;
        let stopped = workers[first].terminate(Duration::from_secs(30)).await;
        assert!(stopped, "the worker did not stop on SIGTERM");
        assert!(
            !workers[first]
                .log_lines_with("gave the task back as this host stops")
                .is_empty()
        );
        // Taken up by the other worker well within the lease TTL (30 s).
        workers[other]
            .wait_for_log("took over a task", Duration::from_secs(10))
            .await;
        let record = wait_for("the run to finish", Duration::from_secs(120), || async {
            crate::harness::run_record(&redis, JOB, PERIOD)
                .await
                .filter(|r| r["status"] == "done")
        })
        .await;
        assert_eq!(record["step"], 2, "{record}");
        drop(leader);
    })
    .await;
}

#[tokio::test]
async fn a_cancelled_fan_out_run_ends_its_tasks() {
    deadline(Duration::from_secs(180), async {
        let f = FanOut::start(
            "fanout-cancel",
            2,
            serde_json::json!({"tasks": 4, "spin_ms": 20000, "write_every_ms": 100}),
        )
        .await;
        f.host_logging("\"task started\"", &[], Duration::from_secs(60))
            .await;
        let url = f.redis.url();
        let out = run_leasehold(&["cancel", JOB, "--period", PERIOD, "--redis-url", &url]);
        assert!(out.status.success(), "{out:?}");
        let record = f.wait_final("cancelled", Duration::from_secs(60)).await;
        assert_eq!(record["awaiting_tasks"], Value::Null, "{record}");
        // The running tasks are stopped (their run has ended) and their records are gone.
        f.host_logging("run has ended", &[], Duration::from_secs(30))
            .await;
        let mut c = f.redis.conn().await;
        let left: bool = c
            .exists(format!("lh:{{{JOB}}}:task:{PERIOD}"))
            .await
            .unwrap();
        assert!(!left, "the cancelled run's task records were kept");
        f.recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
    })
    .await;
}
