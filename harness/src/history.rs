//! A history of what Redis actually applied, recorded with `MONITOR`, and a checker for the
//! fencing invariants over it.
//!
//! Redis executes commands one at a time and `MONITOR` reports them in that order, including
//! the commands a script runs (as `[… lua]` lines right after the script's own line). So the
//! history says, for every applied write of a job's data, run records or checkpoints, which
//! term (owner, token) made it and what the fence held at that moment.
//!
//! The integration tests (failover, billing, operate) record a history around real hosts and
//! assert on it; the checker's own test is in `tests/integration/history.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;

use crate::redis::RedisServer;

/// Records every command the server executes, from `start` until dropped. On a Redis Cluster
/// ([`Recorder::start_cluster`]) it records every primary and merges their histories in time
/// order (see [`merge`]).
pub struct Recorder {
    streams: Vec<Arc<Mutex<Vec<String>>>>,
    /// Client addresses of the test's own operator connections ([`Recorder::operator_conn`]).
    operators: Mutex<HashSet<String>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Every job's fence when recording started: (token, holder).
    pub initial: HashMap<String, (u64, String)>,
}

impl Recorder {
    /// Notes every fence, then starts `MONITOR` on `redis`. A term that starts in between is
    /// missing from both, and its writes would look unfenced: start recording before any host
    /// runs, or while a term holds the lease (it raised its fence before the snapshot).
    pub async fn start(redis: &RedisServer) -> Self {
        Self::start_at(&redis.client()).await
    }

    /// [`Recorder::start`] on any server the client reaches (one in a container, say).
    pub async fn start_at(client: &::redis::Client) -> Self {
        Self::start_on(std::slice::from_ref(client)).await
    }

    /// Records every primary of `cluster` (each its own `MONITOR`), from before any host
    /// starts; the history is their lines merged in time order.
    pub async fn start_cluster(cluster: &crate::cluster::RedisCluster) -> Self {
        let primaries = cluster.primaries().await;
        let clients: Vec<::redis::Client> = primaries
            .iter()
            .map(|p| ::redis::Client::open(format!("redis://{}", p.addr)).unwrap())
            .collect();
        Self::start_on(&clients).await
    }

    async fn start_on(clients: &[::redis::Client]) -> Self {
        let mut initial = HashMap::new();
        let mut streams = Vec::new();
        let mut tasks = Vec::new();
        for client in clients {
            let mut c = client
                .get_multiplexed_async_connection()
                .await
                .expect("connecting to redis");
            let fences: Vec<String> = ::redis::cmd("KEYS")
                .arg("lh:*:fence")
                .query_async(&mut c)
                .await
                .unwrap();
            for key in fences {
                let (token, holder): (Option<u64>, Option<String>) = ::redis::cmd("HMGET")
                    .arg(&key)
                    .arg("token")
                    .arg("holder")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                if let (Some(job), Some(token)) = (job_of(&key), token) {
                    initial.insert(job.to_string(), (token, holder.unwrap_or_default()));
                }
            }
            let monitor = client.get_async_monitor().await.expect("MONITOR");
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = lines.clone();
            tasks.push(tokio::spawn(async move {
                let mut stream = monitor.into_on_message::<String>();
                while let Some(line) = stream.next().await {
                    sink.lock().unwrap().push(line);
                }
            }));
            streams.push(lines);
        }
        Recorder {
            streams,
            operators: Mutex::default(),
            tasks,
            initial,
        }
    }

    /// Waits (up to 10 s) until the recording has caught up with `redis`: an `ECHO` of a fresh
    /// marker, sent now, has come through `MONITOR`, so every command the server executed before
    /// it is in the recording. Call it before stopping a server whose history must be complete.
    pub async fn catch_up(&self, redis: &RedisServer) {
        static MARKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let marker = format!("leasehold-recorder-mark-{}-{n}", std::process::id());
        let mut c = redis.conn().await;
        let _: String = ::redis::cmd("ECHO")
            .arg(&marker)
            .query_async(&mut c)
            .await
            .expect("ECHO");
        let seen = || {
            self.streams
                .iter()
                .any(|s| s.lock().unwrap().iter().rev().any(|l| l.contains(&marker)))
        };
        crate::wait::poll_until(
            "the recording to catch up with the server",
            std::time::Duration::from_secs(10),
            std::time::Duration::from_millis(10),
            || std::future::ready(seen().then_some(())),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Every server's lines so far, one list per server (on a cluster, per primary, in the order
    /// of [`crate::cluster::RedisCluster::primaries`] when recording started).
    pub fn streams(&self) -> Vec<Vec<String>> {
        self.streams
            .iter()
            .map(|s| s.lock().unwrap().clone())
            .collect()
    }

    /// Every line so far (on a cluster, every primary's, merged in time order).
    pub fn lines(&self) -> Vec<String> {
        merge(self.streams())
    }

    /// A connection for the test to act as an operator with (delete a record, write a
    /// request by hand): its plain writes are not counted as writes outside the fence. Any
    /// other plain write of a key only terms write is a violation.
    pub async fn operator_conn(&self, redis: &RedisServer) -> ::redis::aio::MultiplexedConnection {
        let mut c = redis.conn().await;
        let info: String = ::redis::cmd("CLIENT")
            .arg("INFO")
            .query_async(&mut c)
            .await
            .expect("CLIENT INFO");
        let addr = info
            .split_whitespace()
            .find_map(|f| f.strip_prefix("addr="))
            .expect("CLIENT INFO has addr=")
            .to_string();
        self.operators.lock().unwrap().insert(addr);
        c
    }

    /// Checks the history recorded so far (see [`check`]).
    pub fn check(&self) -> Result<History, String> {
        let operators = self.operators.lock().unwrap().clone();
        check_with(self.initial.clone(), &operators, &self.lines())
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Several servers' `MONITOR` lines as one history in time order: each server's lines stay in
/// its order, and a command with the lines its script ran (`[… lua]`, right after it) stays
/// one block, placed by the command's timestamp (the servers share this machine's clock).
pub fn merge(streams: Vec<Vec<String>>) -> Vec<String> {
    if streams.len() == 1 {
        return streams.into_iter().next().unwrap_or_default();
    }
    let stamp = |line: &str| -> f64 {
        line.split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0)
    };
    let mut blocks: Vec<(f64, usize, usize, Vec<String>)> = Vec::new();
    for (s, lines) in streams.into_iter().enumerate() {
        for line in lines {
            let from_lua = parse(&line).is_some_and(|(source, _)| source == "lua");
            match blocks.last_mut() {
                Some((_, last, _, block)) if from_lua && *last == s => block.push(line),
                _ => {
                    let n = blocks.len();
                    blocks.push((stamp(&line), s, n, vec![line]));
                }
            }
        }
    }
    blocks.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
    blocks.into_iter().flat_map(|b| b.3).collect()
}

/// One write that Redis applied inside a fenced-write script.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The full key.
    pub key: String,
    /// The value (for `SET`), empty for `DEL`.
    pub value: String,
    /// The writing term's owner.
    pub owner: String,
    /// The writing term's token.
    pub token: u64,
    /// Position in the recorded history.
    pub at: usize,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct History {
    /// Every term start (fence raised by the acquire script): position, token, owner.
    pub terms: Vec<(usize, u64, String)>,
    /// Every applied fenced write, in order.
    pub applied: Vec<Applied>,
}

impl History {
    /// Applied writes of the run record of `period` that recorded it as done.
    pub fn done_records(&self, job: &str, period: &str) -> Vec<&Applied> {
        let key = format!("lh:{{{job}}}:run:{period}");
        self.applied
            .iter()
            .filter(|a| a.key == key && a.value.contains("\"status\":\"done\""))
            .collect()
    }
}

/// Splits a MONITOR line into its source (`lua`, or the client's address) and the command's
/// arguments (the command first): what a test needs to send a recorded command again.
pub fn split_line(line: &str) -> Option<(String, Vec<String>)> {
    parse(line).map(|(source, args)| (source.to_string(), args))
}

/// Splits a MONITOR line into its source (`lua` or a client address) and its arguments.
fn parse(line: &str) -> Option<(&str, Vec<String>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = line[open + 1..close].split_once(' ').map_or("", |(_, s)| s);
    let mut args = Vec::new();
    let mut chars = line[close + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(u8::from_str_radix(&hex, 16).map(char::from).unwrap_or('?'));
                    }
                    Some(other) => arg.push(other),
                    None => break,
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some((source, args))
}

/// Whether `cmd` on `key` is a write only a term makes.
fn is_term_key(cmd: &str, key: &str) -> bool {
    match cmd {
        "SET" | "DEL" => {
            key.contains(":data:")
                || key.contains(":run:")
                || key.contains(":ckpt:")
                || key.contains(":corrupt:")
                || key.contains(":refused:")
                || key.contains(":task:")
                || key.contains(":taskdata:")
                || key.ends_with(":cursor")
                || key.ends_with(":schedule")
                || key.ends_with(":last")
        }
        "SADD" | "SREM" => key.ends_with(":open"),
        "HDEL" => key.ends_with(":requested"),
        "HSET" | "HINCRBY" => {
            key.ends_with(":usage") || key.contains(":task:") || key.contains(":taskdata:")
        }
        "ZADD" => key.ends_with(":runs"),
        "XADD" => key.ends_with(":tasks"),
        _ => false,
    }
}

fn job_of(key: &str) -> Option<&str> {
    let start = key.find('{')? + 1;
    let end = start + key[start..].find('}')?;
    Some(&key[start..end])
}

/// Checks I1/I2 over the recorded lines: the fence never goes down, never takes the same
/// token for another holder, and every applied write of a term carries a token not below the
/// fence (and, when equal, the fence's own holder). Returns the history, or every violation.
pub fn check(lines: &[String]) -> Result<History, String> {
    check_from(HashMap::new(), lines)
}

/// [`check`], starting from known fences.
pub fn check_from(
    initial: HashMap<String, (u64, String)>,
    lines: &[String],
) -> Result<History, String> {
    check_with(initial, &HashSet::new(), lines)
}

/// [`check_from`], with the client addresses whose plain writes are an operator's.
pub fn check_with(
    initial: HashMap<String, (u64, String)>,
    operators: &HashSet<String>,
    lines: &[String],
) -> Result<History, String> {
    let mut history = History::default();
    let mut fence = initial;
    let mut writer: Option<(String, u64)> = None;
    let mut writer_line = String::new();
    let mut violations = Vec::new();
    for (at, full) in lines.iter().enumerate() {
        // Values can be megabytes long: quote at most the start of a line in a violation.
        let line = &full[..full.char_indices().nth(300).map_or(full.len(), |(i, _)| i)];
        // Parse the whole line: a long script call keeps its token far from the start.
        let Some((source, args)) = parse(full) else {
            continue;
        };
        let from_lua = source == "lua";
        let Some(cmd) = args.first().map(|c| c.to_ascii_uppercase()) else {
            continue;
        };
        if !from_lua {
            writer = None;
            if let Some(key) = args.get(1)
                && is_term_key(&cmd, key)
                && !operators.contains(source)
            {
                violations.push(format!("write outside a fenced-write script: {line}"));
                continue;
            }
            if (cmd == "EVALSHA" || cmd == "EVAL") && args.len() > 3 {
                let nkeys: usize = args[2].parse().unwrap_or(0);
                let keys = &args[3..3 + nkeys.min(args.len() - 3)];
                let argv = &args[3 + keys.len()..];
                if keys.len() >= 2 && keys[1].ends_with(":fence") && argv.len() >= 2 {
                    writer = Some((argv[0].clone(), argv[1].parse().unwrap_or(0)));
                    writer_line = line.to_string();
                }
            }
            continue;
        }
        let key = args.get(1).cloned().unwrap_or_default();
        let Some(job) = job_of(&key).map(str::to_string) else {
            continue;
        };
        match cmd.as_str() {
            "HSET" if key.ends_with(":fence") => {
                let field = |name: &str| {
                    args.iter()
                        .position(|a| a == name)
                        .and_then(|i| args.get(i + 1))
                        .cloned()
                        .unwrap_or_default()
                };
                let token: u64 = field("token").parse().unwrap_or(0);
                let holder = field("holder");
                if let Some((max, max_holder)) = fence.get(&job) {
                    if token < *max {
                        violations.push(format!(
                            "fence of {job} lowered from {max} to {token}: {line}"
                        ));
                    } else if token == *max && holder != *max_holder {
                        violations.push(format!(
                            "fence of {job} at {token} moved from {max_holder} to {holder}: {line}"
                        ));
                    }
                }
                if writer.is_none() {
                    history.terms.push((at, token, holder.clone()));
                }
                fence.insert(job, (token, holder));
            }
            // Every write a term makes: job data, run records, checkpoints, corrupt records
            // moved aside, the cursor, the last-run marker, the open-runs index, the run index,
            // the storage count, the clearing of operator requests, and a run's tasks (queued,
            // taken over, their outputs, written by workers as the term that submitted them).
            // (Operators write requests with HSET/HSETNX and the pause flag with SET/DEL on
            // `:paused`, outside any term.)
            "SET" | "DEL" | "SADD" | "SREM" | "HDEL" | "HSET" | "HINCRBY" | "ZADD" | "XADD"
                if is_term_key(&cmd, &key) =>
            {
                let Some((owner, token)) = writer.clone() else {
                    violations.push(format!("write outside a fenced-write script: {line}"));
                    continue;
                };
                match fence.get(&job) {
                    Some((max, holder)) if token < *max || (token == *max && owner != *holder) => {
                        violations.push(format!("write by {owner} with token {token} applied while the fence held {max} of {holder}: {line}\n  (in the script call {writer_line})"));
                    }
                    None => violations.push(format!("write by {owner} with token {token} applied before any term of {job} began: {line}")),
                    _ => {}
                }
                history.applied.push(Applied {
                    key,
                    value: args.get(2).cloned().unwrap_or_default(),
                    owner,
                    token,
                    at,
                });
            }
            _ => {}
        }
    }
    if violations.is_empty() {
        Ok(history)
    } else {
        Err(violations.join("\n"))
    }
}
