//! Outbound HTTP through the host (`wasi:http`), with the `httpprobe` guest and the harness's
//! fenced receiver: a granted request carries the job, the period and the term's token in
//! headers the guest cannot set; a destination not granted, a name resolving to a forbidden
//! address, a job granted more than the host allows, a response too slow or too large, a DNS
//! or TLS failure are each refused with their own error; a zombie's late request is never sent
//! (cut off: the host's deadline) or, held in flight across a hand-over, refused by the
//! receiver (the token), and no charge is applied twice.

use std::time::Duration;

use leasehold::store::keys::JobKeys;
use leasehold_harness::{Receiver, TestCa};

use crate::harness::*;
use crate::proxy::{Fault as ProxyFault, FaultProxy};

const JOB: &str = "httpprobe";
const PERIOD: &str = "2026-01-01";

/// Writes the probe, its plan and its sidecar (only when changed: a host reloads on change).
fn deploy(plan: &str, sidecar: &str, (jobs, data): &(TempDir, TempDir)) {
    std::fs::create_dir_all(data.join(JOB)).unwrap();
    let write = |path: std::path::PathBuf, text: &str| {
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(path, text).unwrap();
        }
    };
    write(data.join(JOB).join("plan.txt"), plan);
    // The fixture's yearly schedule pinned to 2026, so that [`PERIOD`] is its period in any year.
    write(
        jobs.join(&format!("{JOB}.toml")),
        &format!("{}{sidecar}", crate::harness::PINNED_TO_2026),
    );
    if !jobs.join(&format!("{JOB}.wasm")).exists() {
        std::fs::copy(guests().wasm(JOB), jobs.join(&format!("{JOB}.wasm"))).unwrap();
    }
}

/// A host of the probe against `redis`, with `extra` flags (`--http-allow …`).
fn host(node: &str, redis: &str, dirs: &(TempDir, TempDir), extra: &[&str]) -> HostProcess {
    host_with_env(node, redis, dirs, extra, &[])
}

/// [`host`] with environment variables (`SSL_CERT_FILE`).
fn host_with_env(
    node: &str,
    redis: &str,
    (jobs, data): &(TempDir, TempDir),
    extra: &[&str],
    env: &[(&str, &str)],
) -> HostProcess {
    let cache = data.join("cache");
    let mut args = vec![
        "run",
        "--redis-url",
        redis,
        "--jobs-dir",
        jobs.path().to_str().unwrap(),
        "--node-id",
        node,
        "--lease-ttl",
        "2s",
        "--heartbeat",
        "500ms",
        "--data-dir",
        data.path().to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    start_host_with_env(&args, env)
}

/// The probe's outcomes of `PERIOD`, by plan line.
async fn outcomes(redis: &RedisServer) -> std::collections::BTreeMap<usize, String> {
    let keys = JobKeys::new(JOB);
    let mut conn = redis.conn().await;
    let found: Vec<String> =
        redis::AsyncCommands::keys(&mut conn, keys.data(&format!("result/{PERIOD}/*")))
            .await
            .unwrap();
    let mut out = std::collections::BTreeMap::new();
    for k in found {
        let line: usize = k.rsplit('/').next().unwrap().parse().unwrap();
        let v: String = redis::AsyncCommands::get(&mut conn, &k).await.unwrap();
        out.insert(line, v);
    }
    out
}

async fn wait_done(redis: &RedisServer) -> serde_json::Value {
    wait_for(
        "the probe's run to finish",
        Duration::from_secs(120),
        || async {
            run_record(redis, JOB, PERIOD)
                .await
                .filter(|r| r["status"] == "done" || r["status"] == "failed")
        },
    )
    .await
}

#[tokio::test]
async fn a_granted_request_carries_the_token_and_every_limit_has_its_error() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let granted = Receiver::start().await;
        let other = Receiver::start().await;
        // HTTPS: one server whose CA the host trusts (SSL_CERT_FILE), one signed by another CA.
        let (trusted_ca, other_ca) = (TestCa::make(), TestCa::make());
        let secure = Receiver::start_tls(&trusted_ca).await;
        let untrusted = Receiver::start_tls(&other_ca).await;
        let (s, u) = (secure.url(), untrusted.url());
        let dns = "http://no-such-host.invalid";
        let dirs = (TempDir::new("http-jobs"), TempDir::new("http-data"));
        let g = granted.url();
        let plan = format!(
            "header leasehold-token 999\n\
             header Leasehold-Job other\n\
             header x-trace abc\n\
             get {g}/echo\n\
             get {o}/echo\n\
             get {g}/hang\n\
             get {g}/big?5000\n\
             get {g}/big?1000\n\
             get {dns}/\n\
             get {s}/echo\n\
             get {u}/echo\n\
             follow {g}/redirect?{g}/echo\n\
             follow {g}/redirect?{o}/echo\n",
            o = other.url()
        );
        let sidecar = format!(
            "[http]\nallow = [\"{g}\", \"{dns}\", \"{s}\", \"{u}\"]\ntimeout = \"1s\"\nmax-response = \"4KiB\"\n"
        );
        deploy(&plan, &sidecar, &dirs);
        let allow = [g.as_str(), dns, s.as_str(), u.as_str()].join(" ");
        let h = host_with_env(
            "n1",
            &redis.url(),
            &dirs,
            &["--http-allow", &allow, "--http-allow-private"],
            &[("SSL_CERT_FILE", trusted_ca.ca.to_str().unwrap())],
        );
        h.wait_for_log("became leader", Duration::from_secs(60)).await;
        trigger(&redis, JOB, PERIOD);
        let record = wait_done(&redis).await;
        assert_eq!(record["status"], "done", "{record}");
        let token = record["token"].as_u64().expect("the run's token");
        let got = outcomes(&redis).await;
        let expect = |line: usize, start: &str| {
            assert!(
                got[&line].starts_with(start),
                "line {line}: {:?} (all: {got:?})",
                got[&line]
            );
        };
        // The host's headers are forbidden to the guest, whatever their case.
        expect(1, "err HeaderError::Forbidden");
        expect(2, "err HeaderError::Forbidden");
        expect(3, "ok set");
        expect(4, &format!("ok 200 job={JOB} period={PERIOD} token={token}"));
        // Not granted: refused before any connection.
        expect(5, "err ErrorCode::HttpRequestDenied");
        // The job's timeout (1 s), not wasmtime-wasi-http's 600 s.
        expect(6, "err ErrorCode::HttpResponseTimeout");
        // Larger than max-response (4 KiB) / within it.
        expect(7, "err ErrorCode::HttpResponseBodySize");
        expect(8, "ok 200 xxxx");
        expect(9, "err ErrorCode::DnsError");
        // HTTPS verified against the CA the host trusts; a certificate it does not trust is a
        // TLS error, and that server never gets the request.
        expect(10, &format!("ok 200 job={JOB} period={PERIOD} token={token}"));
        expect(11, "err ErrorCode::TlsCertificateError");
        assert!(untrusted.received().is_empty(), "{:?}", untrusted.received());
        // A redirect within the grant is followed (a new request, checked like the first); one
        // out of it is refused at the hop that leaves, before any connection.
        expect(12, &format!("ok 200 job={JOB} period={PERIOD} token={token}"));
        expect(13, "err hop 2: ErrorCode::HttpRequestDenied");
        // What the receiver got: the echo with the term's token once, the guest's own header.
        let echo: Vec<_> = granted
            .received()
            .into_iter()
            .filter(|r| r.path == "/echo")
            .collect();
        assert_eq!(echo.len(), 2, "{echo:?}");
        assert!(echo.iter().all(|r| r.token() == Some(token)), "{echo:?}");
        let r = &echo[0];
        assert_eq!(r.token(), Some(token));
        assert_eq!(r.count("leasehold-token"), 1);
        assert_eq!(r.header("leasehold-job"), Some(JOB));
        assert_eq!(r.header("leasehold-period"), Some(PERIOD));
        assert_eq!(r.header("x-trace"), Some("abc"));
        assert_eq!(other.connections(), 0, "a connection to a destination not granted");
        let refused = h.log_lines_with("http request refused");
        assert!(
            refused
                .iter()
                .any(|l| l.contains(&format!("{} is not granted to job {JOB}", other.url()))),
            "{refused:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn forbidden_addresses_and_grants_beyond_the_host_are_refused_naming_them() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let receiver = Receiver::start().await;
        let dirs = (TempDir::new("http-jobs"), TempDir::new("http-data"));
        // A granted name that resolves to loopback, on a host that forbids private addresses.
        let local = format!("http://localhost:{}", receiver.port);
        deploy(
            &format!("get {local}/echo\n"),
            &format!("[http]\nallow = [\"{local}\"]\n"),
            &dirs,
        );
        let h = host("n1", &redis.url(), &dirs, &["--http-allow", &local]);
        h.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, JOB, PERIOD);
        let record = wait_done(&redis).await;
        assert_eq!(record["status"], "done", "{record}");
        let got = outcomes(&redis).await;
        assert!(
            got[&1].starts_with("err ErrorCode::DestinationIpProhibited"),
            "{got:?}"
        );
        assert_eq!(receiver.connections(), 0);
        let line = h
            .wait_for_log("a loopback address", Duration::from_secs(5))
            .await;
        assert!(line.contains("--http-allow-private"), "{line}");
        // A sidecar granting a destination the host does not list: the job is refused, named.
        let extra = "http://127.0.0.1:9";
        deploy(
            &format!("get {local}/echo\n"),
            &format!("[http]\nallow = [\"{local}\", \"{extra}\"]\n"),
            &dirs,
        );
        let line = h
            .wait_for_log("which this host does not allow", Duration::from_secs(30))
            .await;
        assert!(line.contains("http://127.0.0.1:9"), "{line}");
    })
    .await;
}

/// How the leader with a request in flight is taken away.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// SIGSTOP past its lease (resumed once its successor is done).
    Freeze,
    /// SIGKILL.
    Kill,
    /// Its Redis cut off: it ends its term at its local deadline and cancels the request.
    Cut,
}

#[tokio::test]
async fn a_frozen_leaders_request_in_flight_is_refused_by_the_receiver() {
    request_in_flight_across_a_handover(Fault::Freeze).await;
}

#[tokio::test]
async fn a_killed_leaders_request_in_flight_is_refused_by_the_receiver() {
    request_in_flight_across_a_handover(Fault::Kill).await;
}

#[tokio::test]
async fn a_cut_off_leader_cancels_its_request_and_sends_nothing_after_its_deadline() {
    request_in_flight_across_a_handover(Fault::Cut).await;
}

/// The leader's charge is held in flight by the receiver while the leader is taken away; the
/// successor charges under its higher token; the held request, processed last, is refused (409)
/// because its token is lower; the charge is applied once, by the successor.
async fn request_in_flight_across_a_handover(fault: Fault) {
    deadline(Duration::from_secs(240), async {
        let redis = RedisServer::start().await;
        let receiver = Receiver::start().await;
        let dirs = (TempDir::new("http-jobs"), TempDir::new("http-data"));
        let r = receiver.url();
        // The cut-off leader's step goes on after its request is cancelled: its second request
        // (after the hold) is what the host's deadline stops.
        let plan = format!(
            "header idempotency-key charge-{PERIOD}\n\
             post {r}/hold one charge\n\
             hold 3000\n\
             header idempotency-key late-{PERIOD}\n\
             post {r}/charge late\n"
        );
        deploy(
            &plan,
            &format!(
                "[catch-up]\npolicy = \"skip\"\n[http]\nallow = [\"{r}\"]\ntimeout = \"30s\"\n"
            ),
            &dirs,
        );
        let proxies = [
            FaultProxy::start(redis.port).await,
            FaultProxy::start(redis.port).await,
        ];
        let flags = ["--http-allow", r.as_str(), "--http-allow-private"];
        let mut hosts = [
            host("n1", &proxies[0].url(), &dirs, &flags),
            host("n2", &proxies[1].url(), &dirs, &flags),
        ];
        for h in &hosts {
            h.wait_for_log("loaded job", Duration::from_secs(60)).await;
        }
        trigger(&redis, JOB, PERIOD);
        wait_for(
            "the leader's charge held in flight",
            Duration::from_secs(60),
            || async { (receiver.held() == 1).then_some(()) },
        )
        .await;
        let keys = JobKeys::new(JOB);
        let owner: String = redis::AsyncCommands::get(&mut redis.conn().await, keys.lease())
            .await
            .unwrap();
        let (z, s) = if owner.starts_with("n1:") {
            (0, 1)
        } else {
            (1, 0)
        };
        let old_token: u64 = redis::AsyncCommands::get(&mut redis.conn().await, keys.token())
            .await
            .unwrap();
        let before = hosts[s].log_lines_with("became leader").len();
        match fault {
            Fault::Freeze => hosts[z].pause(),
            Fault::Kill => hosts[z].kill(),
            Fault::Cut => proxies[z].set(ProxyFault::Blackhole),
        }
        if fault == Fault::Cut {
            // Its term ends at its local deadline, and the request in flight is cancelled.
            hosts[z]
                .wait_for_log(
                    "the term ended with the request in flight",
                    Duration::from_secs(30),
                )
                .await;
        }
        wait_for(
            "the other host to lead",
            Duration::from_secs(60),
            || async { (hosts[s].log_lines_with("became leader").len() > before).then_some(()) },
        )
        .await;
        // The successor charges at once (only the first /hold is held), then finishes.
        std::fs::write(dirs.1.join(JOB).join("release"), "").unwrap();
        let record = wait_done(&redis).await;
        assert_eq!(record["status"], "done", "{record}");
        let new_token = record["token"].as_u64().unwrap();
        assert!(new_token > old_token);
        // Now the held request is processed: its token is below the successor's.
        receiver.release();
        wait_for(
            "the held request answered",
            Duration::from_secs(30),
            || async {
                receiver
                    .received()
                    .iter()
                    .any(|q| q.token() == Some(old_token) && q.path == "/hold")
                    .then_some(())
            },
        )
        .await;
        let held = receiver
            .received()
            .into_iter()
            .find(|q| q.token() == Some(old_token) && q.path == "/hold")
            .unwrap();
        assert_eq!(
            held.status, 409,
            "the zombie's request was not refused: {held:?}"
        );
        if fault == Fault::Freeze {
            hosts[z].resume();
            hosts[z]
                .wait_for_log("stopped leading", Duration::from_secs(30))
                .await;
        }
        // No charge twice, and nothing of the old term applied; the old term sent nothing
        // after its deadline (its `late` request never reached the receiver).
        let applied = receiver.applied();
        assert_eq!(
            applied.get(&format!("charge-{PERIOD}")),
            Some(&new_token),
            "{applied:?}"
        );
        assert!(applied.values().all(|&t| t == new_token), "{applied:?}");
        let from_old: Vec<_> = receiver
            .received()
            .into_iter()
            .filter(|q| q.token() == Some(old_token) && q.path != "/hold")
            .collect();
        assert!(
            from_old.is_empty(),
            "the old term sent after its deadline: {from_old:?}"
        );
    })
    .await;
}
