//! On a three-primary Redis Cluster: fenced write latency and crash failover, beside a single
//! Redis node in the same run.

use std::path::Path;
use std::time::Duration;

use leasehold::store::Conn;
use leasehold_harness::{RedisCluster, RedisServer};

use super::{Options, Pulse, Row, row, summary};

/// Median and p99 (µs) of `n` one-at-a-time fenced writes of 100 B over `conn`, and of as
/// many plain `SET`s to the same job's slot.
async fn write_latency(conn: &mut Conn, n: usize) -> ((f64, f64), (f64, f64)) {
    let mut s = super::write_samples(conn, "bench-write", n).await;
    let (_, fm, fp) = summary(&mut s.fenced);
    let (_, sm, sp) = summary(&mut s.set);
    ((fm, fp), (sm, sp))
}

pub(crate) async fn cluster(guests: &Path, o: &Options, rows: &mut Vec<Row>) {
    eprintln!("on a 3-primary Redis Cluster");
    let n = 20_000;
    let single = RedisServer::start().await;
    let mut c = Conn::connect(
        &single.url(),
        Duration::from_secs(2),
        Some(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let ((single_med, single_p99), _) = write_latency(&mut c, n).await;
    drop(single);
    let cluster = RedisCluster::start(3, 0).await;
    let mut c = Conn::connect(
        &cluster.url(),
        Duration::from_secs(2),
        Some(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let ((med, p99), (set_med, set_p99)) = write_latency(&mut c, n).await;
    rows.push(row(
        "fenced write latency on a 3-primary Redis Cluster (100 B, one at a time)",
        format!("median {med:.0} / p99 {p99:.0} µs ({:.2}× SET on the cluster)", med / set_med),
        &format!(
            "single node, same run: median {single_med:.0} / p99 {single_p99:.0} µs; SET on the cluster median {set_med:.0} / p99 {set_p99:.0} µs"
        ),
        "≤ 1.3 × SET",
        Some(med <= 1.3 * set_med),
    ));
    let url = cluster.url();
    let mut p = Pulse::start_on(guests, url, Box::new(cluster), "1s", "200ms").await;
    let mut v = p.trials(o.trials, false).await;
    let (min, med, p99) = summary(&mut v);
    rows.push(row(
        &format!(
            "crash failover on a 3-primary Redis Cluster, ttl 1s (SIGKILL → first step), {} trials",
            o.trials
        ),
        format!("min {min:.0} / median {med:.0} / p99 {p99:.0} ms"),
        "single node: the crash failover rows above",
        "≤ ttl + 100 ms = 1100 ms p99",
        Some(p99 <= 1100.0),
    ));
}
