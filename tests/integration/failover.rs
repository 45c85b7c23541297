//! The reference scenario between real `leasehold` processes: three replicas, a run long
//! enough to be interrupted (generated statement of a few thousand lines per step), and the
//! leader crashed, frozen, or stopped gracefully mid-run. Every scenario checks the history
//! Redis applied (see [`crate::history`]) and that the period has exactly one result.

use std::time::Duration;

use leasehold_harness::fixtures::write_generated_day;
use redis::AsyncCommands;
use serde_json::Value;

use leasehold::coord::terms::{TermEnd, TermRecord};
use leasehold::store::keys::JobKeys;

use crate::harness::{
    self, HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests, wait_for,
};
use crate::history::{self, Recorder};
use crate::proxy::{Fault, FaultProxy};

const PERIOD: &str = "2026-11-27";
/// The day after [`PERIOD`], for a second run in one test.
const NEXT_PERIOD: &str = "2026-11-28";

struct Cluster {
    dir: TempDir,
    redis: RedisServer,
    hosts: Vec<HostProcess>,
    /// What Redis applies, recorded from before the first host starts (so every term start is
    /// in it).
    recorder: Recorder,
    /// One fault proxy per host, when the cluster was started with them.
    proxies: Vec<FaultProxy>,
    /// How long after sending an acquire or renewal a host may act: ttl − margin (ttl / 10).
    window_ms: u64,
    expected: recon_core::Totals,
}

impl Cluster {
    /// Three replicas with the reconciliation job on a generated day of `rows` lines.
    async fn start(name: &str, rows: usize, ttl: &str, heartbeat: &str) -> Self {
        Self::start_on(
            RedisServer::start().await,
            false,
            name,
            rows,
            ttl,
            heartbeat,
        )
        .await
    }

    /// The same, each host reaching Redis through its own [`FaultProxy`].
    async fn start_proxied(name: &str, rows: usize, ttl: &str, heartbeat: &str) -> Self {
        Self::start_on(RedisServer::start().await, true, name, rows, ttl, heartbeat).await
    }

    /// The same, against a given Redis.
    async fn start_on(
        redis: RedisServer,
        proxied: bool,
        name: &str,
        rows: usize,
        ttl: &str,
        heartbeat: &str,
    ) -> Self {
        let dir = TempDir::new(name);
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(
            guests().wasm("reconciliation"),
            dir.join("jobs/reconciliation.wasm"),
        )
        .unwrap();
        let generated =
            write_generated_day(&dir.join("data"), "reconciliation", PERIOD, rows, 7).unwrap();
        let recorder = Recorder::start(&redis).await;
        let mut hosts = Vec::new();
        let mut proxies = Vec::new();
        for i in 0..3 {
            let (jobs, data) = (dir.join("jobs"), dir.join("data"));
            let url = if proxied {
                proxies.push(FaultProxy::start(redis.port).await);
                proxies[i].url()
            } else {
                redis.url()
            };
            let data = ["--data-dir", data.to_str().unwrap()];
            hosts.push(HostProcess::start_node(
                LEASEHOLD,
                &url,
                &jobs,
                &format!("n{i}"),
                (ttl, heartbeat),
                &data,
            ));
        }
        Cluster {
            dir,
            redis,
            hosts,
            recorder,
            proxies,
            window_ms: humantime::parse_duration(ttl).unwrap().as_millis() as u64 * 9 / 10,
            expected: generated.expected,
        }
    }

    /// The first host to lead, and its token.
    async fn first_leader(&self) -> (usize, u64) {
        let i = self
            .host_logging("became leader", None, Duration::from_secs(60))
            .await;
        (
            i,
            token_of(&self.hosts[i].log_lines_with("became leader")[0]),
        )
    }

    /// Triggers the run and waits until leader `i` has finished `steps` steps.
    async fn trigger_and_wait(&self, i: usize, steps: usize) {
        self.trigger();
        self.wait_steps(i, steps, Duration::from_secs(120)).await;
    }

    /// The index of the host that logged `needle` (waits up to `limit`), skipping `except`.
    async fn host_logging(&self, needle: &str, except: Option<usize>, limit: Duration) -> usize {
        wait_for(&format!("a host to log {needle:?}"), limit, || {
            let found = (0..self.hosts.len())
                .filter(|i| Some(*i) != except)
                .find(|i| !self.hosts[*i].log_lines_with(needle).is_empty());
            async move { found }
        })
        .await
    }

    fn trigger(&self) {
        harness::trigger(&self.redis, "reconciliation", PERIOD);
    }

    /// The job's term history (newest first), every entry parsed, in token order, holding every
    /// term a host logged ("became leader"), and logged by a host, every term it holds.
    ///
    /// A host logs its term after the acquire script recorded it, and its log reaches the
    /// harness later still: the terms logged before Redis is read must all be stored, and the
    /// log lines of the stored ones are waited for (terms begun since Redis was read, newer
    /// than the newest stored, are left out). A stored term that is never logged is one whose
    /// acquire reply was lost (a cut connection): its holder never knew it led, so it may only
    /// be open or `crashed`.
    async fn terms(&self) -> Vec<TermRecord> {
        let keys = JobKeys::new("reconciliation");
        let logged_before = self.logged_tokens();
        let (terms, bad) =
            leasehold::coord::terms::history(&mut self.redis.conn().await, &keys, 100)
                .await
                .unwrap();
        assert_eq!(bad, 0, "unparsed entries in {terms:?}");
        assert!(
            terms.windows(2).all(|w| w[0].token > w[1].token),
            "{terms:?}"
        );
        let stored: Vec<u64> = terms.iter().map(|t| t.token).collect();
        assert!(
            logged_before.iter().all(|t| stored.contains(t)),
            "a logged term is missing from the history: logged {logged_before:?}, stored {stored:?}"
        );
        let newest = stored.first().copied().unwrap_or(0);
        let logged_now = || -> Vec<u64> {
            self.logged_tokens()
                .into_iter()
                .filter(|t| *t <= newest)
                .collect()
        };
        let all_logged = leasehold_harness::poll_until(
            "the log lines of every stored term",
            Duration::from_secs(5),
            Duration::from_millis(20),
            || {
                let done = logged_now() == stored;
                async move { done.then_some(()) }
            },
        )
        .await;
        if all_logged.is_err() {
            let logged = logged_now();
            for t in terms.iter().filter(|t| !logged.contains(&t.token)) {
                assert!(
                    matches!(t.end, None | Some(TermEnd::Crashed)),
                    "stored term {t:?} was never logged (logged {logged:?})"
                );
            }
            assert!(
                logged.iter().all(|t| stored.contains(t)),
                "the history holds exactly the logged terms: logged {logged:?}, stored {stored:?}"
            );
        }
        terms
    }

    /// The tokens of every term the hosts logged ("became leader"), newest first.
    fn logged_tokens(&self) -> Vec<u64> {
        let mut logged: Vec<u64> = self
            .hosts
            .iter()
            .flat_map(|h| h.log_lines_with("became leader"))
            .map(|l| token_of(&l))
            .collect();
        logged.sort_unstable_by(|a, b| b.cmp(a));
        logged
    }

    /// The job's preferred member once it leads (so no hand-over moves the run), and the
    /// token of its term.
    async fn settled_leader(&self) -> (usize, u64) {
        let i = self.preferred_leader().await;
        let owner = self.lease_holder().await;
        let line = wait_for(
            "the leader's term in its log",
            Duration::from_secs(10),
            || {
                let line = self.hosts[i]
                    .log_lines_with("became leader")
                    .into_iter()
                    .find(|l| l.contains(&owner));
                async move { line }
            },
        )
        .await;
        (i, token_of(&line))
    }

    /// The owner (`node:uuid`) the job's lease holds now.
    async fn lease_holder(&self) -> String {
        self.redis
            .conn()
            .await
            .get("lh:{reconciliation}:lease")
            .await
            .unwrap()
    }

    /// How many terms each host has logged so far (for [`Cluster::new_leader`]).
    fn terms_logged(&self) -> Vec<usize> {
        harness::terms_logged(&self.hosts)
    }

    /// The first host other than `except` to log a term beyond `before` (its count from
    /// [`Cluster::terms_logged`]), and that term's log line ([`harness::new_leader`]).
    async fn new_leader(
        &self,
        before: &[usize],
        except: usize,
        limit: Duration,
    ) -> (usize, String) {
        harness::new_leader(&self.hosts, before, except, limit).await
    }

    /// Host `i`'s latest term's token.
    fn last_token(&self, i: usize) -> u64 {
        token_of(
            self.hosts[i]
                .log_lines_with("became leader")
                .last()
                .expect("a term"),
        )
    }

    /// Waits until the term with `token` ended as `how` (by host `i`), and returns the history.
    async fn term_ended(&self, token: u64, i: usize, how: &[TermEnd]) -> Vec<TermRecord> {
        let want = format!("term {token} to end as {how:?}");
        let terms = wait_for(&want, Duration::from_secs(30), || async {
            let terms = self.terms().await;
            let t = terms.iter().find(|t| t.token == token)?;
            t.end.filter(|e| how.contains(e))?;
            Some(terms)
        })
        .await;
        let t = terms.iter().find(|t| t.token == token).unwrap();
        assert_eq!(t.node, format!("n{i}"), "{t:?}");
        assert!(t.ended_ms.unwrap() >= t.started_ms, "{t:?}");
        terms
    }

    async fn record(&self) -> Option<Value> {
        harness::run_record(&self.redis, "reconciliation", PERIOD).await
    }

    async fn wait_done(&self, limit: Duration) -> Value {
        wait_for("the run to be done", limit, || async {
            self.record().await.filter(|r| r["status"] == "done")
        })
        .await
    }

    /// The run was finished by `n{second}` (the host that took over after the fault), or by a
    /// member a later leader handed the run to between two steps (balancing: a graceful
    /// hand-over to the job's preferred member, logged as such).
    fn assert_finished_by(&self, record: &Value, second: usize) {
        let node = record["node"].as_str().unwrap_or_default();
        let handed_to: Vec<String> = self
            .hosts
            .iter()
            .flat_map(|h| {
                h.log_lines_with("handing over to the job's preferred member between steps")
            })
            .filter_map(|l| {
                let v: Value = serde_json::from_str(&l).ok()?;
                v["to"].as_str().map(str::to_string)
            })
            .collect();
        assert!(
            node == format!("n{second}") || handed_to.iter().any(|t| t == node),
            "the run was finished by {node}, neither n{second} nor a member it was handed to between steps ({handed_to:?}): {record}"
        );
    }

    /// The host whose term holds the job's lease once it is the job's preferred member among
    /// the three (balancing moves the job there, between runs, after the cluster starts).
    async fn preferred_leader(&self) -> usize {
        let want = harness::preferred_node("reconciliation", self.hosts.len());
        wait_for(
            "the preferred member to lead",
            Duration::from_secs(120),
            || async {
                let owner: Option<String> = self
                    .redis
                    .conn()
                    .await
                    .get("lh:{reconciliation}:lease")
                    .await
                    .ok()
                    .flatten();
                owner.filter(|o| o.starts_with(&format!("{want}:")))
            },
        )
        .await;
        want[1..].parse().unwrap()
    }

    /// Waits until the leader `i` has finished `steps` steps of the run.
    async fn wait_steps(&self, i: usize, steps: usize, limit: Duration) {
        wait_for(&format!("n{i} to finish {steps} steps"), limit, || {
            let n = self.hosts[i].log_lines_with("\"step done\"").len();
            async move { (n >= steps).then_some(()) }
        })
        .await;
    }

    /// The report's totals equal the generator's, and the history holds exactly one `done`.
    async fn assert_one_correct_result(&self) -> history::History {
        let mut c = self.redis.conn().await;
        let summary: String = c
            .get(format!("lh:{{reconciliation}}:data:report/{PERIOD}"))
            .await
            .unwrap();
        let summary: Value = serde_json::from_str(&summary).unwrap();
        let totals: recon_core::Totals = serde_json::from_value(summary["totals"].clone()).unwrap();
        assert_eq!(totals, self.expected, "report totals");
        let history = self
            .recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
        assert_eq!(
            history.done_records("reconciliation", PERIOD).len(),
            1,
            "exactly one done record"
        );
        harness::check_host_events(&self.hosts, self.window_ms);
        history
    }
}

/// Every token any host became leader with, in no particular order.
fn all_terms(cluster: &Cluster) -> Vec<u64> {
    cluster
        .hosts
        .iter()
        .flat_map(|h| h.log_lines_with("became leader"))
        .map(|l| token_of(&l))
        .collect()
}

/// Terms that a fault ended, on every host: `stopped leading` (a lost term). A graceful
/// hand-over to a job's preferred member (balancing) ends a term without it.
fn lost_terms(cluster: &Cluster) -> usize {
    cluster
        .hosts
        .iter()
        .map(|h| h.log_lines_with("stopped leading").len())
        .sum()
}

fn owner_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap();
    v["owner"].as_str().unwrap().to_string()
}

fn token_of(line: &str) -> u64 {
    let v: Value = serde_json::from_str(line).unwrap();
    v["token"].as_u64().unwrap()
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_and_the_run_finishes_from_its_checkpoint() {
    deadline(Duration::from_secs(300), async {
        let cluster = Cluster::start("crash", 30_000, "1s", "200ms").await;
        let (first, first_token) = cluster.settled_leader().await;
        cluster.trigger_and_wait(first, 3).await;
        let mut cluster = cluster;
        let killed = cluster.last_token(first);
        let before = cluster.terms_logged();
        cluster.hosts[first].kill();

        let (second, _) = cluster
            .new_leader(&before, first, Duration::from_secs(30))
            .await;
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        cluster.assert_finished_by(&record, second);
        let second_token = record["token"].as_u64().unwrap();
        assert!(
            second_token > first_token,
            "{second_token} must exceed {first_token}"
        );
        let resumed = cluster.hosts[second]
            .wait_for_log("resuming run from its checkpoint", Duration::from_secs(5))
            .await;
        let resumed: Value = serde_json::from_str(&resumed).unwrap();
        assert!(resumed["step"].as_u64().unwrap() >= 3, "{resumed}");
        assert_eq!(resumed["previous_node"], format!("n{first}"));
        let history = cluster.assert_one_correct_result().await;
        // Both terms wrote; the second never overlapped the first.
        assert!(history.applied.iter().any(|a| a.token == first_token));
        assert!(history.applied.iter().any(|a| a.token == second_token));
        // The term history: the killed leader's term never said how it ended (crashed); the
        // successor's is there.
        let terms = cluster.term_ended(killed, first, &[TermEnd::Crashed]).await;
        let now = terms.iter().find(|t| t.token == second_token).unwrap();
        assert_eq!(now.node, record["node"].as_str().unwrap(), "{now:?}");
    })
    .await;
}

#[tokio::test]
async fn a_frozen_leader_wakes_as_a_zombie_and_changes_nothing() {
    deadline(Duration::from_secs(300), async {
        let cluster = Cluster::start("zombie", 30_000, "1s", "200ms").await;
        let (first, first_token) = cluster.settled_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        let paused = cluster.last_token(first);
        // The frozen term's owner (the host, back, may later lead again in a term of its own).
        let first_owner = owner_of(
            cluster.hosts[first]
                .log_lines_with("became leader")
                .last()
                .unwrap(),
        );
        let before = cluster.terms_logged();
        cluster.hosts[first].pause();

        let (second, took_over) = cluster
            .new_leader(&before, first, Duration::from_secs(30))
            .await;
        let second_token = token_of(&took_over);
        assert!(second_token > first_token);
        cluster.hosts[second]
            .wait_for_log("resuming run from its checkpoint", Duration::from_secs(30))
            .await;
        // Wake the zombie while its successor is mid-run.
        cluster.hosts[first].resume();
        cluster.hosts[first]
            .wait_for_log("stopped leading", Duration::from_secs(30))
            .await;

        let record = cluster.wait_done(Duration::from_secs(120)).await;
        cluster.assert_finished_by(&record, second);
        let history = cluster.assert_one_correct_result().await;
        // Nothing of the zombie's term was applied after its successor's term began.
        let (takeover, _, _) = history
            .terms
            .iter()
            .find(|(_, t, _)| *t == second_token)
            .expect("second term in history");
        let late: Vec<_> = history
            .applied
            .iter()
            .filter(|a| a.at > *takeover && a.owner == first_owner)
            .collect();
        assert!(
            late.is_empty(),
            "zombie writes applied after the takeover: {late:?}"
        );
        // Back, the zombie says how its term ended in place of the successor's `crashed`.
        cluster
            .term_ended(paused, first, &[TermEnd::Expired, TermEnd::Fenced])
            .await;
    })
    .await;
}

#[tokio::test]
async fn a_leader_stopped_with_sigterm_hands_over_without_waiting_for_its_lease() {
    // A 60 s lease and a 45 s test budget for the handover: only the release can do it.
    deadline(Duration::from_secs(300), async {
        let cluster = Cluster::start("graceful", 30_000, "60s", "5s").await;
        let (first, _) = cluster.settled_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        let stopped = cluster.last_token(first);
        let before = cluster.terms_logged();
        let mut cluster = cluster;
        assert!(
            cluster.hosts[first]
                .terminate(Duration::from_secs(20))
                .await,
            "exit status"
        );
        // Its last lines reach the harness after the exit: wait for the release's.
        cluster.hosts[first]
            .wait_for_log("released lease", Duration::from_secs(5))
            .await;
        assert_eq!(
            cluster.hosts[first].log_lines_with("released lease").len(),
            1
        );
        let (second, _) = cluster
            .new_leader(&before, first, Duration::from_secs(45))
            .await;
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        cluster.assert_finished_by(&record, second);
        cluster.hosts[second]
            .wait_for_log("resuming run from its checkpoint", Duration::from_secs(5))
            .await;
        cluster.assert_one_correct_result().await;
        cluster
            .term_ended(stopped, first, &[TermEnd::Released])
            .await;
        let _ = &cluster.dir;
    })
    .await;
}

/// Redis crashes and comes back. `aof`: with its append-only file (fsync always); otherwise
/// empty. Either way the cluster recovers, tokens keep growing, and a run triggered after the
/// restart completes exactly once.
async fn redis_restart(aof: bool) {
    let redis = if aof {
        RedisServer::start_with_aof().await
    } else {
        RedisServer::start().await
    };
    let mut cluster = Cluster::start_on(
        redis,
        false,
        if aof { "restart-aof" } else { "restart-empty" },
        2_000,
        "1s",
        "200ms",
    )
    .await;
    let (_, before) = cluster.first_leader().await;

    cluster.redis.crash_and_restart().await;
    if !aof {
        // Everything is gone, the lease too: the old leader's renewal fails and a new term
        // starts, with a token above everything issued before (the clock floor).
        let newer = wait_for("a term after the restart", Duration::from_secs(30), || {
            let t = all_terms(&cluster).into_iter().find(|t| *t != before);
            async move { t }
        })
        .await;
        assert!(
            newer > before,
            "token {newer} after losing everything must exceed {before}"
        );
    }
    // The old recording ended with the old server; record the new one once a term holds the
    // lease, so that the term's start is in the recorder's snapshot of the fences.
    wait_for(
        "a lease after the restart",
        Duration::from_secs(30),
        || async {
            let mut c = cluster.redis.conn().await;
            let holder: Option<String> = c.get("lh:{reconciliation}:lease").await.unwrap();
            holder.map(|_| ())
        },
    )
    .await;
    cluster.recorder = Recorder::start(&cluster.redis).await;
    cluster.trigger();
    let record = cluster.wait_done(Duration::from_secs(120)).await;
    assert!(record["token"].as_u64().unwrap() >= before);
    cluster.assert_one_correct_result().await;

    // Hand over once more: the next term's token is above every earlier one. The leader now is
    // the lease's holder (balancing may have handed the job on after the run).
    let holder = harness::lease_owner(&cluster.redis, "reconciliation").await;
    let leader: usize = holder.split(':').next().unwrap()[1..].parse().unwrap();
    let highest = all_terms(&cluster).into_iter().max().unwrap();
    assert!(
        cluster.hosts[leader]
            .terminate(Duration::from_secs(20))
            .await
    );
    // Whichever other host leads next (it may or may not have led before the crash).
    let next_token = wait_for("the next term", Duration::from_secs(30), || {
        let t = (0..cluster.hosts.len())
            .filter(|i| *i != leader)
            .flat_map(|i| cluster.hosts[i].log_lines_with("became leader"))
            .map(|l| token_of(&l))
            .find(|t| *t > highest);
        async move { t }
    })
    .await;
    assert!(next_token > highest);
    let mut tokens = all_terms(&cluster);
    let n = tokens.len();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "a token was issued twice");
}

#[tokio::test]
async fn after_a_redis_crash_with_an_append_only_file_tokens_keep_growing() {
    deadline(Duration::from_secs(300), redis_restart(true)).await;
}

#[tokio::test]
async fn after_a_redis_crash_that_loses_everything_tokens_still_grow() {
    deadline(Duration::from_secs(300), redis_restart(false)).await;
}

fn timestamp_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line).unwrap();
    v["timestamp"].as_str().unwrap().to_string()
}

/// The leader loses Redis mid-run (`fault` on its proxy only). It must stop acting at its local
/// deadline, before a successor's term begins (I3); nothing of its term may land after that,
/// even bytes it had in flight (`Fault::Hold` delivers them late); and after healing it rejoins
/// as a follower.
async fn cut_off(name: &str, fault: Fault) {
    let cluster = Cluster::start_proxied(name, 30_000, "1s", "200ms").await;
    let (first, _) = cluster.settled_leader().await;
    cluster.trigger_and_wait(first, 2).await;
    let cut = cluster.last_token(first);
    let followed_before = cluster.hosts[first].log_lines_with("\"following\"").len();
    let before = cluster.terms_logged();
    cluster.proxies[first].set(fault);

    let (second, took_over) = cluster
        .new_leader(&before, first, Duration::from_secs(30))
        .await;
    let stopped = cluster.hosts[first]
        .wait_for_log("stopped leading", Duration::from_secs(30))
        .await;
    assert!(stopped.contains("local lease deadline passed"), "{stopped}");
    let took_over = &took_over;
    assert!(
        timestamp_of(&stopped) <= timestamp_of(took_over),
        "n{first} acted until {} but n{second} led from {}",
        timestamp_of(&stopped),
        timestamp_of(took_over)
    );

    cluster.proxies[first].set(Fault::None);
    wait_for(
        &format!("n{first} to rejoin as a follower"),
        Duration::from_secs(30),
        || {
            let n = cluster.hosts[first].log_lines_with("\"following\"").len();
            async move { (n > followed_before).then_some(()) }
        },
    )
    .await;
    let record = cluster.wait_done(Duration::from_secs(120)).await;
    cluster.assert_finished_by(&record, second);
    cluster.assert_one_correct_result().await;
    // Cut off when its term ended, the host reported how once Redis answered again.
    cluster
        .term_ended(cut, first, &[TermEnd::Expired, TermEnd::Fenced])
        .await;
}

#[tokio::test]
async fn a_leader_cut_off_from_redis_stops_at_its_local_deadline_and_rejoins_as_a_follower() {
    deadline(
        Duration::from_secs(300),
        cut_off("cutoff", Fault::Blackhole),
    )
    .await;
}

#[tokio::test]
async fn writes_held_in_flight_and_released_after_a_takeover_are_refused() {
    deadline(Duration::from_secs(300), cut_off("held", Fault::Hold)).await;
}

#[tokio::test]
async fn slow_redis_moves_leadership_at_most_once() {
    deadline(Duration::from_secs(300), async {
        // redis-timeout is heartbeat / 2 = 100 ms.
        let cluster = Cluster::start_proxied("slow", 30_000, "1s", "200ms").await;
        // The fault goes to the job's preferred member once it leads, so that no hand-over
        // between runs moves the job away from the host under test.
        let first = cluster.preferred_leader().await;
        // Terms lost while the hosts were still starting (compiling, with a 1 s lease) are not
        // the fault's.
        let lost_before = lost_terms(&cluster);
        // 2 × 30 ms per round trip: slow, but within the timeout. Nothing changes.
        cluster.proxies[first].set(Fault::Latency(Duration::from_millis(30)));
        cluster.trigger();
        let record = cluster.wait_done(Duration::from_secs(120)).await;
        // Balancing may hand the job to its preferred member (gracefully, between runs); latency
        // moves nothing.
        assert!(record["status"] == "done", "{record}");
        assert_eq!(
            lost_terms(&cluster) - lost_before,
            0,
            "leadership moved under latency below the timeout"
        );
        cluster.assert_one_correct_result().await;

        // 2 × 150 ms: every renewal times out. Leadership moves once, and stays moved.
        let led: Vec<usize> = cluster
            .hosts
            .iter()
            .map(|h| h.log_lines_with("became leader").len())
            .collect();
        cluster.proxies[first].set(Fault::Latency(Duration::from_millis(150)));
        let second = wait_for("another host to lead", Duration::from_secs(30), || {
            let found = (0..cluster.hosts.len())
                .filter(|i| *i != first)
                .find(|i| cluster.hosts[*i].log_lines_with("became leader").len() > led[*i]);
            async move { found }
        })
        .await;
        // The next day (not the first one again: the first run's request is cleared by its
        // leader's last write, which the latency can delay past a trigger made now).
        write_generated_day(
            &cluster.dir.join("data"),
            "reconciliation",
            NEXT_PERIOD,
            5_000,
            8,
        )
        .unwrap();
        harness::trigger(&cluster.redis, "reconciliation", NEXT_PERIOD);
        let record = wait_for(
            "the next day's run to be done",
            Duration::from_secs(120),
            || async {
                harness::run_record(&cluster.redis, "reconciliation", NEXT_PERIOD)
                    .await
                    .filter(|r| r["status"] == "done")
            },
        )
        .await;
        // The fault moved leadership once (to `second`); balancing may then have handed the job
        // to the survivors' preferred member, gracefully, between runs.
        assert_ne!(second, first);
        assert_ne!(record["node"], format!("n{first}"), "{record}");
        assert_eq!(
            lost_terms(&cluster) - lost_before,
            1,
            "more than one change of leader for one fault: {:?}",
            all_terms(&cluster)
        );
        cluster
            .recorder
            .check()
            .unwrap_or_else(|v| panic!("fencing violated:\n{v}"));
    })
    .await;
}

#[tokio::test]
async fn cpu_heavy_guests_on_every_host_do_not_starve_lease_renewal() {
    deadline(Duration::from_secs(300), async {
        // Host i alone runs spinner-i (a CPU-bound job firing every second), and all three
        // campaign for the reconciliation, which is CPU-bound too. Two cores, three busy hosts.
        // The spinners are one component, which names itself spinner-a: a sidecar names the
        // copies of hosts 1 and 2 spinner-b and spinner-c.
        let redis = RedisServer::start().await;
        let dir = TempDir::new("cpu");
        write_generated_day(&dir.join("data"), "reconciliation", PERIOD, 30_000, 9).unwrap();
        let mut hosts = Vec::new();
        for (i, spinner) in ["spinner_a", "spinner_b", "spinner_c"].iter().enumerate() {
            let jobs = dir.join(&format!("jobs-{i}"));
            std::fs::create_dir_all(&jobs).unwrap();
            std::fs::copy(
                guests().wasm("spinner"),
                jobs.join(format!("{spinner}.wasm")),
            )
            .unwrap();
            if i > 0 {
                let name = spinner.replace('_', "-");
                std::fs::write(
                    jobs.join(format!("{spinner}.toml")),
                    format!("name = \"{name}\"\n"),
                )
                .unwrap();
            }
            std::fs::copy(
                guests().wasm("reconciliation"),
                jobs.join("reconciliation.wasm"),
            )
            .unwrap();
            let data = dir.join("data");
            let data = ["--data-dir", data.to_str().unwrap()];
            hosts.push(HostProcess::start_node(
                LEASEHOLD,
                &redis.url(),
                &jobs,
                &format!("n{i}"),
                ("1s", "200ms"),
                &data,
            ));
        }
        harness::trigger(&redis, "reconciliation", PERIOD);
        // Every spinner completes three runs and the reconciliation completes.
        wait_for(
            "three runs of every spinner and the reconciliation",
            Duration::from_secs(200),
            || {
                let runs_of = |h: &HostProcess, job: &str| {
                    h.log_lines_with("\"run done\"")
                        .iter()
                        .filter(|l| l.contains(&format!("\"job\":\"{job}\"")))
                        .count()
                };
                let spinners_done = ["spinner-a", "spinner-b", "spinner-c"]
                    .iter()
                    .enumerate()
                    .all(|(i, job)| runs_of(&hosts[i], job) >= 3);
                let recon_done = hosts.iter().any(|h| runs_of(h, "reconciliation") >= 1);
                async move { (spinners_done && recon_done).then_some(()) }
            },
        )
        .await;
        // Meanwhile no renewal was late and no leadership moved: one term per job.
        for (i, h) in hosts.iter().enumerate() {
            let late: Vec<String> = h
                .log()
                .into_iter()
                .filter(|l| l.contains("renewal") || l.contains("stopped leading"))
                .collect();
            assert!(late.is_empty(), "n{i} struggled to renew: {late:?}");
        }
        // (A graceful hand-over of the reconciliation to its preferred member is balancing,
        // not a lost term: it begins one more term.)
        // A hand-over in flight logs its two lines a moment apart: read until they agree.
        let count = || {
            let terms: usize = hosts
                .iter()
                .map(|h| h.log_lines_with("became leader").len())
                .sum();
            let hand_overs: usize = hosts
                .iter()
                .map(|h| h.log_lines_with("handed over: lease released").len())
                .sum();
            terms as i64 - hand_overs as i64
        };
        let _ = leasehold_harness::poll_until(
            "terms and hand-overs to agree",
            Duration::from_secs(5),
            Duration::from_millis(50),
            || {
                let n = count();
                async move { (n == 4).then_some(()) }
            },
        )
        .await;
        assert_eq!(
            count(),
            4,
            "one term for each spinner and one for the reconciliation"
        );
    })
    .await;
}

#[tokio::test]
async fn connections_reset_mid_run_lose_nothing() {
    deadline(Duration::from_secs(300), async {
        let cluster = Cluster::start_proxied("reset", 30_000, "1s", "200ms").await;
        // The preferred member, so that no hand-over moves the run before the reset.
        let (first, _) = cluster.settled_leader().await;
        cluster.trigger_and_wait(first, 2).await;
        for proxy in &cluster.proxies {
            proxy.reset();
        }
        // Whoever leads now: reset again once two more steps are done.
        wait_for("two more steps", Duration::from_secs(120), || {
            let steps: usize = cluster
                .hosts
                .iter()
                .map(|h| h.log_lines_with("\"step done\"").len())
                .sum();
            async move { (steps >= 4).then_some(()) }
        })
        .await;
        for proxy in &cluster.proxies {
            proxy.reset();
        }
        cluster.wait_done(Duration::from_secs(120)).await;
        cluster.assert_one_correct_result().await;
    })
    .await;
}
