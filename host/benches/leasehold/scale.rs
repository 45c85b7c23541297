//! Many jobs × three replicas: balance, Redis round trips, a replica lost and back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use leasehold_harness::{HostProcess, RedisServer, TempDir, http};
use redis::AsyncCommands;

use super::{LEASEHOLD, Row, place, row, summary, timestamp};

/// Heartbeat and TTL of the replicas (seconds).
const HEARTBEAT: f64 = 2.0;
const TTL: f64 = 10.0;

/// CPU seconds and resident memory of a process, from /proc.
pub(crate) fn cpu_and_rss(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|x| x.1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks / 100.0, rss_kb * 1024)
}

/// `INFO commandstats`: calls per command.
async fn command_calls(c: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// A host's `leasehold_redis_round_trips_total` by kind, from its `/metrics`.
async fn round_trips(addr: &str) -> BTreeMap<String, f64> {
    let (code, body) = http(addr, "GET", "/metrics", None).await;
    assert_eq!(code, 200);
    let text = body
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string());
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("leasehold_redis_round_trips_total{kind=\"")?;
            let (kind, value) = rest.split_once("\"} ")?;
            Some((kind.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A connection that waits for Redis as long as a busy Redis needs (10,000 jobs starting).
pub(crate) async fn patient(redis: &RedisServer) -> leasehold::store::Conn {
    leasehold::store::Conn::connect(
        &redis.url(),
        Duration::from_secs(5),
        Some(Duration::from_secs(60)),
    )
    .await
    .unwrap()
}

/// Job → the node whose term holds its lease now.
pub(crate) async fn owners(c: &mut leasehold::store::Conn) -> BTreeMap<String, String> {
    let keys: Vec<String> = c.keys("lh:*:lease").await.unwrap();
    let mut out = BTreeMap::new();
    for chunk in keys.chunks(1000) {
        let values: Vec<Option<String>> = c.mget(chunk).await.unwrap();
        for (k, v) in chunk.iter().zip(values) {
            if let Some(v) = v {
                let job = k["lh:{".len()..k.len() - "}:lease".len()].to_string();
                let node = v.split(':').next().unwrap_or("").to_string();
                out.insert(job, node);
            }
        }
    }
    out
}

fn spread(owners: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let mut s = BTreeMap::new();
    for node in owners.values() {
        *s.entry(node.clone()).or_insert(0) += 1;
    }
    s
}

/// Whether every one of `nodes` leads within 10 % of an equal share of `n` jobs.
fn balanced(s: &BTreeMap<String, usize>, nodes: &[&str], n: usize) -> bool {
    let share = n as f64 / nodes.len() as f64;
    s.len() == nodes.len()
        && nodes.iter().all(|node| {
            s.get(*node)
                .is_some_and(|v| (*v as f64 - share).abs() <= share * 0.1)
        })
}

/// A replica logging at `info` (JSON): the debug events the tests read (a line per renewal
/// and per write) would cost more CPU than the work measured. TTL 10 s, heartbeat 2 s.
pub(crate) fn start_host(redis: &RedisServer, jobs: &Path, cache: &Path, i: usize) -> HostProcess {
    start_host_timed(redis, jobs, cache, i, ("10s", "2s"))
}

/// [`start_host`] with `(ttl, heartbeat)`.
fn start_host_timed(
    redis: &RedisServer,
    jobs: &Path,
    cache: &Path,
    i: usize,
    (ttl, heartbeat): (&str, &str),
) -> HostProcess {
    let node = format!("n{i}");
    let args = [
        "run",
        "--redis-url",
        &redis.url(),
        "--jobs-dir",
        jobs.to_str().unwrap(),
        "--node-id",
        &node,
        "--lease-ttl",
        ttl,
        "--heartbeat",
        heartbeat,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
    ];
    HostProcess::start(LEASEHOLD, &args, &[("LEASEHOLD_LOG", "info")])
}

/// Whether every job is led by its preferred member among `nodes`.
fn preferred_everywhere(owners: &BTreeMap<String, String>, nodes: &[&str]) -> bool {
    let members: leasehold::coord::members::Members = nodes
        .iter()
        .map(|n| {
            (
                n.to_string(),
                leasehold::coord::members::MemberInfo::with_capacity(1),
            )
        })
        .collect();
    owners.iter().all(|(job, node)| {
        leasehold::coord::members::preferred(job, &members, None) == Some(node.as_str())
    })
}

/// A jobs directory of `n` jobs: one component, a sidecar name each (`bench-00000`, …).
pub(crate) fn jobs_dir(
    guests: &Path,
    dir: &TempDir,
    n: usize,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (jobs, cache) = (dir.join("jobs"), dir.join("cache"));
    std::fs::create_dir_all(&jobs).unwrap();
    place(&guests.join("benchjob.wasm"), &jobs.join("b00000.wasm"));
    for i in 0..n {
        if i > 0 {
            std::os::unix::fs::symlink("b00000.wasm", jobs.join(format!("b{i:05}.wasm"))).unwrap();
        }
        std::fs::write(
            jobs.join(format!("b{i:05}.toml")),
            format!("name = \"bench-{i:05}\"\n"),
        )
        .unwrap();
    }
    (jobs, cache)
}

/// Each lost job's first term on a survivor (`became leader` after `t0`), in ms after `t0`.
fn first_terms(survivors: &[HostProcess], lost: &BTreeSet<String>, t0: SystemTime) -> Vec<f64> {
    let mut first: BTreeMap<String, f64> = BTreeMap::new();
    for l in survivors
        .iter()
        .flat_map(|h| h.log_lines_with("became leader"))
    {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) else {
            continue;
        };
        let (Some(job), at) = (v["job"].as_str(), timestamp(&l)) else {
            continue;
        };
        if lost.contains(job) && at > t0 {
            let ms = at.duration_since(t0).unwrap_or_default().as_secs_f64() * 1e3;
            let e = first.entry(job.to_string()).or_insert(ms);
            *e = e.min(ms);
        }
    }
    first.into_values().collect()
}

/// Kills `n2` (SIGKILL) and waits until the survivors lead all `n` jobs: the jobs it led, and
/// for each the time until its first term on a survivor (ms).
async fn kill_n2(
    redis: &RedisServer,
    hosts: &mut [HostProcess],
    n: usize,
) -> (BTreeSet<String>, Vec<f64>) {
    let lost = led_by(&owners(&mut patient(redis).await).await, "n2");
    let t0 = SystemTime::now();
    hosts[2].kill();
    super::wait_async(
        "the survivors to lead every job",
        Duration::from_secs(120),
        || async {
            let o = owners(&mut patient(redis).await).await;
            (o.len() == n && o.values().all(|node| node != "n2")).then_some(())
        },
    )
    .await;
    let took = first_terms(&hosts[..2], &lost, t0);
    (lost, took)
}

/// The jobs `node` leads now, by the lease.
fn led_by(owners: &BTreeMap<String, String>, node: &str) -> BTreeSet<String> {
    owners
        .iter()
        .filter(|(_, n)| *n == node)
        .map(|(job, _)| job.clone())
        .collect()
}

/// `n` jobs × three replicas at a short TTL (500 ms, heartbeat 150 ms): leadership changes in a
/// fault-free window of `quiet`, then one replica killed and each of its jobs' failover.
pub(crate) async fn fast(guests: &Path, n: usize, quiet: Duration, rows: &mut Vec<Row>) {
    const TIMING: (&str, &str) = ("500ms", "150ms");
    eprintln!("{n} jobs across 3 replicas, ttl 500ms, heartbeat 150ms");
    let redis = RedisServer::start().await;
    let dir = TempDir::new("bench-fast");
    let (jobs, cache) = jobs_dir(guests, &dir, n);
    let mut hosts: Vec<HostProcess> = (0..3)
        .map(|i| start_host_timed(&redis, &jobs, &cache, i, TIMING))
        .collect();
    for h in &hosts {
        let a = h.http_addr(Duration::from_secs(120)).await;
        super::wait_async("a host ready", Duration::from_secs(600), || async {
            (http(&a, "GET", "/readyz", None).await.0 == 200).then_some(())
        })
        .await;
    }
    let nodes = ["n0", "n1", "n2"];
    super::wait_async(
        "every job on its preferred member",
        Duration::from_secs(600),
        || async {
            let o = owners(&mut patient(&redis).await).await;
            (o.len() == n && preferred_everywhere(&o, &nodes)).then_some(())
        },
    )
    .await;
    // Fault-free: every change of leader in the window is one too many.
    let terms = |hosts: &[HostProcess]| -> usize {
        hosts
            .iter()
            .map(|h| h.log_lines_with("became leader").len())
            .sum()
    };
    let lost_terms = |hosts: &[HostProcess]| -> usize {
        hosts
            .iter()
            .map(|h| h.log_lines_with("stopped leading").len())
            .sum()
    };
    let (terms0, lost0) = (terms(&hosts), lost_terms(&hosts));
    let cpu0: Vec<(f64, u64)> = hosts.iter().map(|h| cpu_and_rss(h.pid())).collect();
    eprintln!("  a fault-free window of {} s", quiet.as_secs());
    tokio::time::sleep(quiet).await;
    let cpu1: Vec<(f64, u64)> = hosts.iter().map(|h| cpu_and_rss(h.pid())).collect();
    let (changes, lost) = (terms(&hosts) - terms0, lost_terms(&hosts) - lost0);
    let cpu: Vec<String> = cpu0
        .iter()
        .zip(&cpu1)
        .map(|(a, b)| format!("{:.0}%", (b.0 - a.0) / quiet.as_secs_f64() * 100.0))
        .collect();
    rows.push(row(
        &format!(
            "{n} jobs × 3 replicas, ttl 500ms, heartbeat 150ms: changes of leader in {:.0} fault-free minutes",
            quiet.as_secs_f64() / 60.0
        ),
        format!("{changes} new terms, {lost} terms lost · host CPU {}", cpu.join(" / ")),
        "-",
        "0 in 10 minutes",
        Some(changes == 0 && lost == 0 && quiet >= Duration::from_secs(600)),
    ));

    // One killed: every one of its jobs fails over.
    let (lost, mut took) = kill_n2(&redis, &mut hosts, n).await;
    let (min, med, p99) = summary(&mut took);
    rows.push(row(
        &format!(
            "{n} jobs × 3 replicas, ttl 500ms, heartbeat 150ms: one killed, each of its {} jobs led again (SIGKILL → became leader)",
            lost.len()
        ),
        format!("min {min:.0} / median {med:.0} / p99 {p99:.0} ms ({} of {} jobs)", took.len(), lost.len()),
        "client-go 15–24 s per job with defaults",
        "≤ 600 ms p99 for every job",
        Some(p99 <= 600.0 && took.len() == lost.len()),
    ));
    drop(hosts);
}

/// `n` jobs (one component, a sidecar name each) × three replicas, TTL 10 s, heartbeat 2 s.
pub(crate) async fn scale(guests: &Path, n: usize, rows: &mut Vec<Row>) {
    eprintln!("{n} jobs across 3 replicas");
    let redis = RedisServer::start().await;
    let dir = TempDir::new("bench-scale");
    let (jobs, cache) = jobs_dir(guests, &dir, n);
    let spawned = Instant::now();
    let mut hosts: Vec<HostProcess> = (0..3)
        .map(|i| start_host(&redis, &jobs, &cache, i))
        .collect();
    let mut addrs = Vec::new();
    for h in &hosts {
        addrs.push(h.http_addr(Duration::from_secs(120)).await);
    }
    // Ready: every file loaded on every host (`/readyz`).
    for a in &addrs {
        super::wait_async("a host ready", Duration::from_secs(600), || async {
            (http(a, "GET", "/readyz", None).await.0 == 200).then_some(())
        })
        .await;
    }
    let ready = Instant::now();
    let mut c = redis.conn().await;
    let nodes = ["n0", "n1", "n2"];
    let balanced_at = super::wait_async(
        "every replica within 10 % of its share",
        Duration::from_secs(600),
        || async {
            let o = owners(&mut patient(&redis).await).await;
            (o.len() == n && balanced(&spread(&o), &nodes, n)).then(Instant::now)
        },
    )
    .await;
    let after_ready = balanced_at.saturating_duration_since(ready).as_secs_f64();
    let after_spawn = balanced_at.saturating_duration_since(spawned).as_secs_f64();
    rows.push(row(
        &format!("{n} jobs × 3 replicas: every replica within 10 % of {:.0} jobs", n as f64 / 3.0),
        format!(
            "{after_ready:.1} s ({:.1} heartbeats) after the last replica was ready (every job loaded); {after_spawn:.1} s after the three processes were started",
            after_ready / HEARTBEAT
        ),
        "KCL lease taker, Zeebe/Redpanda leadership balancing",
        "within three heartbeats (6 s) of the last start",
        Some(after_ready <= 3.0 * HEARTBEAT),
    ));

    // Steady state: a window of ten heartbeats, once every job has run its period.
    super::wait_async("every job run", Duration::from_secs(300), || async {
        let done: Vec<String> = patient(&redis).await.keys("lh:*:last").await.unwrap();
        (done.len() == n).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(20);
    let calls0 = command_calls(&mut c).await;
    let mut trips0 = Vec::new();
    for a in &addrs {
        trips0.push(round_trips(a).await);
    }
    let cpu0: Vec<(f64, u64)> = hosts.iter().map(|h| cpu_and_rss(h.pid())).collect();
    tokio::time::sleep(window).await;
    let calls1 = command_calls(&mut c).await;
    let mut trips1 = Vec::new();
    for a in &addrs {
        trips1.push(round_trips(a).await);
    }
    let cpu1: Vec<(f64, u64)> = hosts.iter().map(|h| cpu_and_rss(h.pid())).collect();
    let secs = window.as_secs_f64();
    let beats = secs / HEARTBEAT;
    let delta = |name: &str| {
        calls1.get(name).copied().unwrap_or(0) - calls0.get(name).copied().unwrap_or(0)
    };
    let total: u64 = calls1
        .keys()
        .filter(|k| *k != "info")
        .map(|k| delta(k))
        .sum();
    let mut by_command: Vec<(String, u64)> = calls1
        .keys()
        .map(|k| (k.clone(), delta(k)))
        .filter(|(k, d)| *d > 0 && k != "info")
        .collect();
    by_command.sort_by_key(|c| std::cmp::Reverse(c.1));
    let by_command: Vec<String> = by_command
        .iter()
        .take(6)
        .map(|(k, d)| format!("{k} {:.0}/s", *d as f64 / secs))
        .collect();
    let mut kinds = BTreeMap::<String, f64>::new();
    for (a, b) in trips0.iter().zip(&trips1) {
        for (k, v) in b {
            *kinds.entry(k.clone()).or_default() +=
                (v - a.get(k).copied().unwrap_or(0.0)) / 3.0 / beats;
        }
    }
    let trips: f64 = kinds.values().sum();
    rows.push(row(
        &format!("{n} jobs × 3 replicas: Redis round trips per host per heartbeat (2 s)"),
        format!(
            "{trips:.2} ({})",
            kinds
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "47.7 before this change (a state read per idle job every tenth heartbeat, campaigns at each expiry), over 2,000 before that",
        "≤ 3",
        Some(trips <= 3.0),
    ));
    let cpu: Vec<String> = cpu0
        .iter()
        .zip(&cpu1)
        .map(|(a, b)| format!("{:.0}%", (b.0 - a.0) / secs * 100.0))
        .collect();
    let rss: Vec<String> = cpu1
        .iter()
        .map(|(_, r)| format!("{} MiB", r >> 20))
        .collect();
    rows.push(row(
        &format!("{n} jobs × 3 replicas: Redis commands, host CPU and memory"),
        format!(
            "{:.0} commands/s in all ({:.0} per host per heartbeat; {}) · CPU {} · RSS {}",
            total as f64 / secs,
            total as f64 / 3.0 / beats,
            by_command.join(", "),
            cpu.join(" / "),
            rss.join(" / ")
        ),
        "-",
        "-",
        None,
    ));

    // One of three killed: its jobs go to the survivors; the first survivor's term of each (a
    // job may then move on to its preferred survivor by a hand-over).
    let mut p = patient(&redis).await;
    let (lost, mut took) = kill_n2(&redis, &mut hosts, n).await;
    let (_, med, p99) = summary(&mut took);
    let survivors = super::wait_async(
        "the survivors balanced",
        Duration::from_secs(120),
        || async {
            let s = spread(&owners(&mut patient(&redis).await).await);
            balanced(&s, &nodes[..2], n).then_some(s)
        },
    )
    .await;
    // Then every job on its preferred survivor (the first to campaign took it; it moves on by
    // hand-overs), so that the return below moves only what returns.
    super::wait_async(
        "every job on its preferred survivor",
        Duration::from_secs(300),
        || async {
            let o = owners(&mut patient(&redis).await).await;
            (o.len() == n && preferred_everywhere(&o, &nodes[..2])).then_some(())
        },
    )
    .await;
    rows.push(row(
        &format!("{n} jobs × 3 replicas: one killed, its {} jobs led by the survivors (SIGKILL → new leader)", lost.len()),
        format!("median {med:.0} / p99 {p99:.0} ms; then {survivors:?}"),
        "client-go 15–24 s per job with defaults",
        &format!("≤ TTL + one heartbeat = {:.0} ms p99, each survivor within 10 % of {}", (TTL + HEARTBEAT) * 1e3, n / 2),
        Some(p99 <= (TTL + HEARTBEAT) * 1e3 && took.len() == lost.len()),
    ));

    // It returns: its jobs come back, by graceful hand-overs only.
    let before = owners(&mut p).await;
    let (handed0, lost0): (usize, usize) = (
        hosts[..2]
            .iter()
            .map(|h| {
                h.log_lines_with("handing over to the job's preferred member")
                    .len()
            })
            .sum(),
        hosts[..2]
            .iter()
            .map(|h| h.log_lines_with("stopped leading").len())
            .sum(),
    );
    let back = Instant::now();
    hosts[2] = start_host(&redis, &jobs, &cache, 2);
    let after = super::wait_async(
        "the returning replica's share back",
        Duration::from_secs(600),
        || async {
            let o = owners(&mut patient(&redis).await).await;
            (o.len() == n && balanced(&spread(&o), &nodes, n)).then_some(o)
        },
    )
    .await;
    let back_s = back.elapsed().as_secs_f64();
    let moved = before
        .iter()
        .filter(|(job, node)| after.get(*job) != Some(node))
        .count();
    let handed: usize = hosts[..2]
        .iter()
        .map(|h| {
            h.log_lines_with("handing over to the job's preferred member")
                .len()
        })
        .sum::<usize>()
        - handed0;
    let faults: usize = hosts[..2]
        .iter()
        .map(|h| h.log_lines_with("stopped leading").len())
        .sum::<usize>()
        - lost0;
    rows.push(row(
        &format!("{n} jobs × 3 replicas: the killed replica back"),
        format!(
            "{:?} after {back_s:.1} s (it came back within ten minutes of leaving: it settles {} heartbeats first); {moved} jobs moved ({:.1} %), {handed} graceful hand-overs, {faults} terms lost",
            spread(&after),
            leasehold::coord::members::RETURN_SETTLE,
            moved as f64 * 100.0 / n as f64
        ),
        "Knative buckets",
        "within 10 % of the share, every move graceful, ≤ ≈ 1/3 moved",
        Some(faults == 0 && moved as f64 <= n as f64 / 3.0 * 1.1 && handed >= moved),
    ));
    drop(hosts);
}
