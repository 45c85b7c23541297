//! The `sql` import against a real PostgreSQL (the harness's own `initdb`/`postgres`): the fence
//! inside the database serialises terms and refuses an older one; every escape from the host's
//! transaction is refused, through a real host and the `sqlprobe` guest, with nothing written;
//! a frozen, killed or cut-off leader's transaction never lands; a database whose token is
//! ahead of Redis (or a Redis restarted empty behind it) costs a term, not the run; a COMMIT
//! whose reply is lost is `unavailable`; results past the limits are `too-large`; `leasehold
//! db init` is idempotent and a host refuses an untrusted fence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::coord::term::Term;
use leasehold::exec::sql::{self, Databases, SqlAsk, SqlCaps, SqlError, Tx};
use leasehold::store::keys::JobKeys;
use leasehold_harness::{PgServer, TestCa};

use crate::harness::*;
use crate::proxy::{Fault as ProxyFault, FaultProxy};

/// The role `leasehold db init` creates for the jobs, and the hosts log in as.
pub(crate) const ROLE: &str = "lh_jobs";
const PERIOD: &str = "2026-01-01";

/// A database prepared as `leasehold db init` (run through the binary) prepares it, for `jobs`,
/// with a `charges` table the role may use: one row per customer and period.
async fn prepared(jobs: &[&str]) -> PgServer {
    let pg = initialised(jobs).await;
    pg.exec(&format!(
        "CREATE TABLE charges (customer text NOT NULL, period text NOT NULL, token bigint NOT NULL,
             UNIQUE (customer, period));
         GRANT SELECT, INSERT, UPDATE ON charges TO {ROLE};
         CREATE PROCEDURE commits() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;
         GRANT EXECUTE ON PROCEDURE commits() TO {ROLE};
         -- What the guard cannot see (names inside a function's body): the database's own
         -- refusals and the host's timer must hold.
         CREATE FUNCTION lift_timeout() RETURNS text LANGUAGE sql
             AS $$ SELECT set_config('statement_timeout', '0', true) $$;
         CREATE FUNCTION leak(OUT a text, OUT b text) LANGUAGE sql
             AS $$ SELECT set_config('application_name', 'leaked', false),
                          set_config('search_path', 'nowhere', false) $$;
         CREATE FUNCTION raise_by_string() RETURNS xml LANGUAGE sql
             AS $$ SELECT query_to_xml('SELECT * FROM leasehold.raise_fence(''sqlprobe'', 8000000000000000, ''guest'')', false, false, '') $$;
         CREATE FUNCTION raise_again() RETURNS boolean LANGUAGE plpgsql
             AS $$ BEGIN EXECUTE 'SELECT 1 FROM leasehold.' || 'raise_fence($1, $2, $3)'
                   USING 'sqlprobe', 8000000000000000::bigint, 'guest'; RETURN true; END $$;"
    ))
    .await;
    pg
}

/// A new PostgreSQL server on which `leasehold db init` (run through the binary) has created the
/// fence for `jobs` and the restricted role [`ROLE`].
pub(crate) async fn initialised(jobs: &[&str]) -> PgServer {
    let pg = PgServer::start().await;
    db_init(&pg.admin_url(), jobs);
    pg
}

/// `leasehold db init ADMIN_URL --role ROLE --job …` through the binary; it must succeed and
/// say it created the role.
fn db_init(admin_url: &str, jobs: &[&str]) {
    let mut args = vec![
        "db".to_string(),
        "init".into(),
        admin_url.to_string(),
        "--role".into(),
        ROLE.into(),
    ];
    for j in jobs {
        args.extend(["--job".to_string(), j.to_string()]);
    }
    let out = run_leasehold(&args);
    assert!(
        out.status.success(),
        "db init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains(&format!("role {ROLE} created")), "{said}");
}

/// `leasehold db init` once more on a database it has set up, for `sqlprobe`: it succeeds, and
/// says what it did.
fn db_init_again(admin_url: &str) -> String {
    let out = run_leasehold(&["db", "init", admin_url, "--role", ROLE, "--job", "sqlprobe"]);
    assert!(
        out.status.success(),
        "db init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The charges the database holds, in commit order: (customer, token).
async fn charges(pg: &PgServer) -> Vec<(String, i64)> {
    pg.admin()
        .await
        .unwrap()
        .query(
            "SELECT customer, token FROM charges ORDER BY pg_xact_commit_timestamp(xmin), customer",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The fence's token for `job` as the database holds it.
async fn fence_token(pg: &PgServer, job: &str) -> i64 {
    pg.admin()
        .await
        .unwrap()
        .query_one("SELECT token FROM leasehold.fence WHERE job = $1", &[&job])
        .await
        .unwrap()
        .get(0)
}

fn databases(pg: &PgServer) -> Arc<sql::Database> {
    let cfg = sql::parse_database(&format!("ledger={}", pg.url(ROLE))).unwrap();
    let dbs = Databases::new(&[cfg], SqlCaps::default(), Duration::from_secs(2));
    let ask = SqlAsk {
        databases: [("ledger".to_string(), "ledger".to_string())].into(),
        ..SqlAsk::default()
    };
    dbs.for_job(&ask).granted["ledger"].clone()
}

fn limits() -> sql::SqlLimits {
    sql::SqlLimits {
        statement_time: Duration::from_secs(5),
        rows: 100,
        result_bytes: 1 << 20,
        idle: Duration::from_secs(5),
    }
}

fn term(token: u64, owner: &str) -> Term {
    // A clock that says the term lasts: only the database can refuse it.
    Term::new(
        token,
        owner.into(),
        Instant::now() + Duration::from_secs(600),
    )
}

async fn insert(tx: &mut Tx, customer: &str, token: u64) {
    tx.run(
        "INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3)",
        &[
            sql::Value::Text(customer.into()),
            sql::Value::Text(PERIOD.into()),
            sql::Value::Int(token as i64),
        ],
        true,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_fence_row_serialises_terms_and_refuses_an_older_one() {
    deadline(Duration::from_secs(120), async {
        let pg = prepared(&["ledger-job"]).await;
        let db = databases(&pg);
        let (old, new) = (term(5, "a:1"), term(6, "b:1"));
        // The older term holds the row; the newer one waits for it to end.
        let mut a = Tx::begin("ledger", &db, "ledger-job", &old, limits())
            .await
            .unwrap();
        insert(&mut a, "alice", 5).await;
        let waiting = {
            let (db, new) = (db.clone(), new.clone());
            tokio::spawn(
                async move { Tx::begin("ledger", &db, "ledger-job", &new, limits()).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "the newer term did not wait for the older one's row lock"
        );
        a.commit().await.unwrap();
        let mut b = waiting.await.unwrap().unwrap();
        insert(&mut b, "bob", 6).await;
        b.commit().await.unwrap();
        // The older term again, with a clock that still says it leads: the database refuses it.
        let refused = Tx::begin("ledger", &db, "ledger-job", &old, limits()).await;
        match refused {
            Err(SqlError::Fenced {
                token: 5,
                stored: 6,
                ..
            }) => {}
            Err(e) => panic!("expected fenced, got {e}"),
            Ok(_) => panic!("an older term's transaction was begun"),
        }
        // The same token from another holder is refused too (a counter that went backwards).
        assert!(matches!(
            Tx::begin("ledger", &db, "ledger-job", &term(6, "c:1"), limits()).await,
            Err(SqlError::Fenced { stored: 6, .. })
        ));
        assert_eq!(
            charges(&pg).await,
            [("alice".to_string(), 5), ("bob".to_string(), 6)],
            "commit order with tokens"
        );
        assert_eq!(fence_token(&pg, "ledger-job").await, 6);
        // A job not registered for the role cannot raise any fence.
        assert!(matches!(
            Tx::begin("ledger", &db, "other-job", &term(9, "a:1"), limits()).await,
            Err(SqlError::NotGranted(_))
        ));
    })
    .await;
}

/// A single statement (`Tx::single`, the guest's `sql.execute` and `sql.query`) is sent behind
/// the fence before the fence's answer is read: it runs only after the fence, writes nothing
/// when the fence is refused (not even what a rollback does not undo: a sequence), and a
/// connection of the pool cannot write outside the host's transaction.
#[tokio::test]
async fn a_single_statement_runs_behind_the_fence_and_does_nothing_when_it_is_refused() {
    deadline(Duration::from_secs(120), async {
        let pg = prepared(&["ledger-job"]).await;
        pg.exec(&format!(
            "CREATE SEQUENCE s; GRANT USAGE, SELECT, UPDATE ON SEQUENCE s TO {ROLE};"
        ))
        .await;
        let db = databases(&pg);
        let single = |term: Term, statement: &'static str, params: Vec<sql::Value>| {
            let db = db.clone();
            async move {
                Tx::single(
                    "ledger", &db, "ledger-job", &term, limits(), statement, &params, true,
                )
                .await
            }
        };
        let charge = "INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3)";
        let args = |who: &str, token: i64| {
            vec![
                sql::Value::Text(who.into()),
                sql::Value::Text(PERIOD.into()),
                sql::Value::Int(token),
            ]
        };
        let (old, new) = (term(5, "a:1"), term(6, "b:1"));
        assert_eq!(
            single(new.clone(), charge, args("bob", 6)).await.unwrap().2,
            1
        );
        assert_eq!(fence_token(&pg, "ledger-job").await, 6);
        // The older term: refused by the fence, its insert and its sequence call not applied.
        match single(old.clone(), charge, args("alice", 5)).await {
            Err(SqlError::Fenced {
                token: 5,
                stored: 6,
                ..
            }) => {}
            other => panic!("expected fenced, got {:?}", other.map(|r| r.2)),
        }
        assert!(matches!(
            single(old.clone(), "SELECT nextval('s')", vec![]).await,
            Err(SqlError::Fenced { stored: 6, .. })
        ));
        // A job not registered for the role: the fence raises an error, the statement not run.
        assert!(matches!(
            Tx::single(
                "ledger",
                &db,
                "other-job",
                &term(9, "a:1"),
                limits(),
                "SELECT nextval('s')",
                &[],
                false,
            )
            .await,
            Err(SqlError::NotGranted(_))
        ));
        let called: bool = pg
            .admin()
            .await
            .unwrap()
            .query_one("SELECT is_called FROM s", &[])
            .await
            .unwrap()
            .get(0);
        assert!(!called, "a refused term's statement advanced a sequence");
        // The statement's own error rolls the transaction back (a second charge for bob).
        assert!(matches!(
            single(new.clone(), charge, args("bob", 6)).await,
            Err(SqlError::Constraint(ref d)) if d.code == "23505"
        ));
        assert_eq!(charges(&pg).await, [("bob".to_string(), 6)]);
        // A refused term's statement is cut off at once (its timeouts made 1 ms), so it holds
        // the fence's row from the leading term no longer: a sleep of 15 s is cancelled.
        let slow = sql::SqlLimits {
            statement_time: Duration::from_secs(30),
            ..limits()
        };
        let t = Instant::now();
        let refused = Tx::single(
            "ledger",
            &db,
            "ledger-job",
            &old,
            slow,
            "SELECT pg_sleep(15)",
            &[],
            false,
        )
        .await;
        assert!(
            matches!(refused, Err(SqlError::Fenced { stored: 6, .. })),
            "{:?}",
            refused.map(|r| r.2)
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a refused term's statement ran on for {:?}, holding the fence's row",
            t.elapsed()
        );
        // The pool's connections are read-only outside the host's READ WRITE transaction, and
        // the host's check refuses a connection that does not start so (options dropped).
        let plain = pg.connect(ROLE).await.unwrap();
        let unsafe_conn = sql::fence::verify(&plain).await.unwrap_err();
        assert!(unsafe_conn.contains("do not start read-only"), "{unsafe_conn}");
        let mut tx = Tx::begin("ledger", &db, "ledger-job", &new, limits())
            .await
            .unwrap();
        let (_, rows, _) = tx
            .run(
                "SELECT current_setting('default_transaction_read_only'), current_setting('transaction_read_only')",
                &[],
                false,
            )
            .await
            .unwrap();
        assert_eq!(
            rows,
            [vec![
                sql::Value::Text("on".into()),
                sql::Value::Text("off".into())
            ]]
        );
        tx.commit().await.unwrap();
    })
    .await;
}

/// A host running `sqlprobe` with `plan`, granted `ledger`, on the Redis at `redis` (a URL: the
/// server's own, or a fault proxy's in front of it).
async fn probe_host(
    pg: &PgServer,
    plan: &str,
    sidecar: &str,
    node: &str,
    redis: &str,
    dirs: &(TempDir, TempDir),
    ttl: (&str, &str),
) -> HostProcess {
    deploy_probe(plan, sidecar, dirs);
    let database = format!("ledger={}", pg.url(ROLE));
    probe_host_on(node, redis, dirs, ttl, &database, &[])
}

/// Puts `sqlprobe`, its `sidecar` and its `plan` into `dirs` (jobs, data), rewriting only what
/// changed (hosts sharing the directories see each file once).
fn deploy_probe(plan: &str, sidecar: &str, (jobs, data): &(TempDir, TempDir)) {
    std::fs::create_dir_all(data.join("sqlprobe")).unwrap();
    if std::fs::read_to_string(data.join("sqlprobe/plan.txt"))
        .ok()
        .as_deref()
        != Some(plan)
    {
        std::fs::write(data.join("sqlprobe/plan.txt"), plan).unwrap();
    }
    // The probe's yearly schedule pinned to 2026, so that [`PERIOD`] is its period in any year.
    let sidecar = format!("{}{sidecar}", crate::harness::PINNED_TO_2026);
    if std::fs::read_to_string(jobs.join("sqlprobe.toml"))
        .ok()
        .as_deref()
        != Some(sidecar.as_str())
    {
        std::fs::write(jobs.join("sqlprobe.toml"), sidecar).unwrap();
    }
    if !jobs.join("sqlprobe.wasm").exists() {
        std::fs::copy(guests().wasm("sqlprobe"), jobs.join("sqlprobe.wasm")).unwrap();
    }
}

/// A host on the probe deployed in `dirs`, with the database flag `database` (`ledger=URL`) and
/// the environment `env`.
fn probe_host_on(
    node: &str,
    redis: &str,
    (jobs, data): &(TempDir, TempDir),
    (ttl, heartbeat): (&str, &str),
    database: &str,
    env: &[(&str, &str)],
) -> HostProcess {
    let cache = data.join("cache");
    start_host_with_env(
        &[
            "run",
            "--redis-url",
            redis,
            "--jobs-dir",
            jobs.path().to_str().unwrap(),
            "--node-id",
            node,
            "--lease-ttl",
            ttl,
            "--heartbeat",
            heartbeat,
            "--data-dir",
            data.path().to_str().unwrap(),
            "--database",
            database,
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        env,
    )
}

/// The probe's sidecar: 1 s statements and no catch-up (a test triggers the period when it is
/// ready). No `[sql.databases]`: the probe declares `ledger` itself (its `databases` export), so
/// every test here runs on the host's `ledger` granted by that declaration.
const SIDECAR: &str = "[catch-up]\npolicy = \"skip\"\n[sql]\nstatement-time = \"1s\"\n";

/// The recorded outcome of each plan line, by line number.
async fn outcomes(redis: &RedisServer) -> std::collections::BTreeMap<usize, String> {
    let keys = JobKeys::new("sqlprobe");
    let mut conn = redis.conn().await;
    let pattern = keys.data(&format!("result/{PERIOD}/*"));
    let found: Vec<String> = redis::AsyncCommands::keys(&mut conn, pattern)
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

async fn wait_done(redis: &RedisServer, limit: Duration) -> serde_json::Value {
    wait_for("the run to finish", limit, || async {
        run_record(redis, "sqlprobe", PERIOD)
            .await
            .filter(|r| r["status"] == "done" || r["status"] == "failed")
    })
    .await
}

#[tokio::test]
async fn every_escape_from_the_transaction_is_refused_and_nothing_is_written() {
    deadline(Duration::from_secs(180), async {
        let pg = prepared(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        // Each escape inside a transaction that has written a row: the row must never land.
        let escapes = [
            ("COMMIT", "err refused: COMMIT is refused"),
            ("COMMIT AND CHAIN", "err refused: COMMIT is refused"),
            ("ROLLBACK", "err refused: ROLLBACK is refused"),
            ("BEGIN", "err refused: BEGIN is refused"),
            ("SAVEPOINT s", "err refused: SAVEPOINT is refused"),
            ("RELEASE SAVEPOINT s", "err refused: RELEASE is refused"),
            ("SET ROLE postgres", "err refused: SET is refused"),
            ("RESET ROLE", "err refused: RESET is refused"),
            ("SET SESSION AUTHORIZATION postgres", "err refused: SET is refused"),
            ("SET statement_timeout = 0", "err refused: SET is refused"),
            ("DO $$ BEGIN COMMIT; END $$", "err refused: DO is refused"),
            ("CALL commits()", "err refused: CALL is refused"),
            ("INSERT INTO charges VALUES ('x', 'y', 1); COMMIT", "err refused: several statements"),
            ("UPDATE leasehold.fence SET token = 999999999999999999", "err database: 42501"),
            ("CREATE TEMP TABLE fence (job text, token bigint)", "err database: 42501"),
            ("SELECT set_config('role', 'postgres', true)", "err refused: set_config is refused"),
            ("SELECT set_config('idle_in_transaction_session_timeout', '0', true)", "err refused: set_config is refused"),
            ("UPDATE pg_settings SET setting = '0' WHERE name = 'statement_timeout'", "err refused: pg_settings is refused"),
            ("SELECT * FROM leasehold.raise_fence('sqlprobe', 8000000000000000, 'guest')", "err refused: raise_fence is refused"),
            ("SELECT query_to_xml('SELECT 1', false, false, '')", "err refused: query_to_xml is refused"),
            ("ALTER ROLE CURRENT_USER SET standard_conforming_strings = off", "err refused: ALTER ROLE is refused"),
            // The fence function called from a function's body, where no guard reads: the
            // database refuses it once the transaction has an id (the host's raise gave it one).
            ("SELECT raise_again()", "err database: LH002"),
            ("SELECT raise_by_string()", "err database: LH002"),
        ];
        let mut plan = String::new();
        for (i, (escape, _)) in escapes.iter().enumerate() {
            plan.push_str(&format!(
                "begin ledger\ntx INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) | t:escape-{i} | period | token\ntxq {escape}\ntx SELECT 1\ncommit\n"
            ));
        }
        // statement_timeout lifted inside a function (no SET or set_config in the statement):
        // the host's own timer still cancels.
        plan.push_str(
            "begin ledger\ntxq SELECT lift_timeout()\ntxq SELECT pg_sleep(5)\ndrop\n",
        );
        // A committed transaction's session settings (set_config(…, false) in a function
        // outlives the transaction once committed) never reach the next transaction on the
        // connection: one connection (pool=1), so the next transaction surely runs on the same
        // one.
        plan.push_str(
            "begin ledger\ntxq SELECT * FROM leak()\ncommit\n\
             begin ledger\ntxq SELECT current_setting('application_name') = 'leaked', current_setting('search_path') = 'nowhere'\ncommit\n",
        );
        // Then typed errors outside transactions, and one real write.
        plan.push_str(
            "exec ledger INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) | t:alice | period | token\n\
             exec ledger INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) | t:alice | period | token\n\
             exec elsewhere SELECT 1\n\
             query ledger SELECT customer, token = $1, 1.5::float8, NULL, '\\x01'::bytea FROM charges ORDER BY customer | token\n\
             query ledger SELECT now()\n\
             query ledger SELECT nope FROM charges\n",
        );
        deploy_probe(&plan, SIDECAR, &dirs);
        let database = format!("ledger={}?pool=1", pg.url(ROLE));
        let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("became leader", Duration::from_secs(60)).await;
        trigger(&redis, "sqlprobe", PERIOD);
        let record = wait_done(&redis, Duration::from_secs(120)).await;
        assert_eq!(record["status"], "done", "{record}");
        let got = outcomes(&redis).await;
        for (i, (escape, expected)) in escapes.iter().enumerate() {
            let line = i * 5 + 3;
            let said = &got[&line];
            assert!(said.starts_with(expected), "{escape}: {said} (expected {expected}…)");
            // After the refusal the transaction has ended (database errors roll it back) or goes
            // on (host refusals); either way the escape row must not be in the database.
        }
        let n = escapes.len() * 5;
        assert!(got[&(n + 2)].starts_with("ok"), "{}", got[&(n + 2)]);
        assert_eq!(got[&(n + 3)], "err timeout: 1000");
        let n = n + 4;
        assert_eq!(got[&(n + 2)], "ok [[\"leaked\",\"nowhere\"]]", "{got:?}");
        assert_eq!(got[&(n + 3)], "ok committed", "{got:?}");
        assert_eq!(got[&(n + 5)], "ok [[false,false]]", "a setting leaked: {got:?}");
        let n = n + 6;
        assert_eq!(got[&(n + 1)], "ok 1");
        assert!(
            got[&(n + 2)].starts_with("err constraint: 23505") && got[&(n + 2)].contains("constraint=charges_customer_period_key"),
            "{}",
            got[&(n + 2)]
        );
        assert!(got[&(n + 3)].starts_with("err not-granted: database elsewhere is not granted"), "{}", got[&(n + 3)]);
        assert!(got[&(n + 4)].contains("[\"alice\",true,1.5,null,x01]"), "{}", got[&(n + 4)]);
        assert!(got[&(n + 5)].starts_with("err unsupported: column now has type timestamptz"), "{}", got[&(n + 5)]);
        assert!(got[&(n + 6)].starts_with("err database: 42703"), "{}", got[&(n + 6)]);
        // Only host-refused escapes left a transaction open to commit; none of their rows, nor
        // any other escape's, was written except by a commit the host made after the refusal.
        let rows = charges(&pg).await;
        let escaped: Vec<_> = rows
            .iter()
            .filter(|(c, _)| c.starts_with("escape-") || c == "x")
            .collect();
        // A host refusal leaves the transaction open (the guest may go on), so its commit lands
        // the first insert: exactly the escapes refused by the host, under this term's token.
        let host_refused = escapes.iter().filter(|(_, e)| e.starts_with("err refused")).count();
        assert_eq!(escaped.len(), host_refused, "{rows:?}");
        let token = fence_token(&pg, "sqlprobe").await;
        assert!(token < 8_000_000_000_000_000, "the fence was changed by the guest");
        assert!(rows.iter().all(|(_, t)| *t == token), "{rows:?} under fence {token}");
        assert!(!rows.iter().any(|(c, _)| c == "x"), "a second statement ran: {rows:?}");
    })
    .await;
}

/// The plan of a charge that holds its transaction open: begin, insert, mark, spin for `hold`
/// milliseconds, commit.
fn holding_charge(hold: u32) -> String {
    format!(
        "begin ledger\n\
         tx INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING | t:alice | period | token\n\
         mark holding\n\
         hold {hold}\n\
         commit\n"
    )
}

/// How the leader holding the transaction open is taken away.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP past its lease, then SIGCONT once its successor is done.
    Freeze,
    /// SIGKILL: its connection closes and the database rolls back.
    Kill,
    /// Its Redis cut off (a blackhole in front of it) while it runs on with the transaction
    /// open and PostgreSQL still reachable: the host must not COMMIT once its local deadline
    /// has passed.
    Cut,
}

#[tokio::test]
async fn a_frozen_leaders_transaction_never_lands_and_its_successor_charges_once() {
    leader_lost_mid_transaction(Fault::Freeze).await;
}

#[tokio::test]
async fn a_killed_leaders_transaction_never_lands_and_its_successor_charges_once() {
    leader_lost_mid_transaction(Fault::Kill).await;
}

#[tokio::test]
async fn a_leader_cut_off_from_redis_does_not_commit_past_its_deadline() {
    leader_lost_mid_transaction(Fault::Cut).await;
}

/// The leader is taken away (`fault`) while its transaction is open with a row written: the
/// successor waits for the fence's row, charges once under its own token, and nothing of the
/// old term lands, judged from the database's rows, their tokens and their commit order.
async fn leader_lost_mid_transaction(fault: Fault) {
    deadline(Duration::from_secs(240), async {
        let pg = prepared(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        let sidecar = "[catch-up]\npolicy = \"skip\"\n[sql]\nstatement-time = \"10s\"\n[sql.databases]\nledger = \"ledger\"\n";
        // Cut off, the leader spins on with its transaction open until well past its local
        // deadline (lease 2 s), then tries to commit; frozen or killed, it holds until the
        // fault is made (then `release` lets the successor's step go on at once).
        let plan = holding_charge(if fault == Fault::Cut { 5000 } else { 30_000 });
        let proxies = [
            FaultProxy::start(redis.port).await,
            FaultProxy::start(redis.port).await,
        ];
        let mut hosts = [
            probe_host(&pg, &plan, sidecar, "n1", &proxies[0].url(), &dirs, ("2s", "500ms")).await,
            probe_host(&pg, &plan, sidecar, "n2", &proxies[1].url(), &dirs, ("2s", "500ms")).await,
        ];
        for h in &hosts {
            h.wait_for_log("loaded job", Duration::from_secs(60)).await;
        }
        trigger(&redis, "sqlprobe", PERIOD);
        let keys = JobKeys::new("sqlprobe");
        let mark = keys.data("mark/holding");
        wait_for("the leader to hold its transaction open", Duration::from_secs(60), || async {
            let v: Option<String> = redis::AsyncCommands::get(&mut redis.conn().await, &mark)
                .await
                .unwrap();
            v
        })
        .await;
        // Whoever leads now (balancing may have handed the job over) is frozen with its
        // transaction open and the fence row locked.
        let owner: String = redis::AsyncCommands::get(&mut redis.conn().await, keys.lease())
            .await
            .unwrap();
        let (z, s) = if owner.starts_with("n1:") { (0, 1) } else { (1, 0) };
        let before = hosts[s].log_lines_with("became leader").len();
        match fault {
            Fault::Freeze => hosts[z].pause(),
            Fault::Kill => hosts[z].kill(),
            Fault::Cut => proxies[z].set(ProxyFault::Blackhole),
        }
        if fault != Fault::Cut {
            std::fs::write(dirs.1.join("sqlprobe/release"), "").unwrap();
        }
        let (first, second) = (&hosts[z], &hosts[s]);
        if fault == Fault::Cut {
            // It noticed by itself, at its local deadline, and its step ended without a commit.
            let stopped = first
                .wait_for_log("stopped leading", Duration::from_secs(30))
                .await;
            assert!(stopped.contains("local lease deadline passed"), "{stopped}");
            first
                .wait_for_log("step abandoned", Duration::from_secs(30))
                .await;
            // The successor need not hold its transaction open as long (past the database's
            // idle limit, which would end it).
            std::fs::write(dirs.1.join("sqlprobe/release"), "").unwrap();
        }
        wait_for("the other host to lead", Duration::from_secs(60), || async {
            (second.log_lines_with("became leader").len() > before).then_some(())
        })
        .await;
        let record = wait_done(&redis, Duration::from_secs(120)).await;
        assert_eq!(record["status"], "done", "{record}");
        if fault == Fault::Freeze {
            let rows_at_resume = charges(&pg).await;
            first.resume();
            // The zombie's step ends without committing (its term is over, and its session
            // was ended by the database while it was frozen).
            first
                .wait_for_log("step abandoned", Duration::from_secs(30))
                .await;
            assert_eq!(
                charges(&pg).await,
                rows_at_resume,
                "a row landed after the zombie woke"
            );
        }
        let rows = charges(&pg).await;
        let token = fence_token(&pg, "sqlprobe").await;
        assert_eq!(
            rows,
            [("alice".to_string(), token)],
            "one charge, by the successor's term; the probe's outcomes: {:?}",
            outcomes(&redis).await
        );
        let became: serde_json::Value =
            serde_json::from_str(second.log_lines_with("became leader").last().unwrap()).unwrap();
        let second_token = became["token"]
            .as_i64()
            .expect("the successor's token in its log");
        assert_eq!(token, second_token, "the fence holds the successor's token");
    })
    .await;
}

#[tokio::test]
async fn a_database_ahead_of_redis_costs_one_term_and_the_run_still_writes_once() {
    deadline(Duration::from_secs(180), async {
        let pg = prepared(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        let plan = "exec ledger INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING | t:alice | period | token\n";
        let host = probe_host(&pg, plan, SIDECAR, "n1", &redis.url(), &dirs, ("2s", "500ms")).await;
        host.wait_for_log("became leader", Duration::from_secs(60)).await;
        // The database saw terms Redis no longer knows of (Redis restarted empty with its clock
        // set back, or another Redis): its fence is far above any token this Redis issues.
        let ahead: i64 = 1 << 52;
        pg.exec(&format!("UPDATE leasehold.fence SET token = {ahead}, holder = 'elsewhere' WHERE job = 'sqlprobe'"))
            .await;
        trigger(&redis, "sqlprobe", PERIOD);
        let record = wait_done(&redis, Duration::from_secs(120)).await;
        assert_eq!(record["status"], "done", "{record}");
        host.wait_for_log("raised the token counter", Duration::from_secs(5))
            .await;
        let token = fence_token(&pg, "sqlprobe").await;
        assert!(token > ahead, "the fence holds {token}, not above {ahead}");
        assert_eq!(charges(&pg).await, [("alice".to_string(), token)]);
    })
    .await;
}

/// A COMMIT whose reply is lost: the database applied it, the host never heard. The guest gets
/// `unavailable` saying it may or may not have been applied (the row is there: it was), and
/// the step goes on to the end of its plan.
#[tokio::test]
async fn a_commit_whose_reply_is_lost_is_unavailable_and_may_have_been_applied() {
    deadline(Duration::from_secs(120), async {
        let pg = prepared(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        let proxy = FaultProxy::start(pg.port).await;
        deploy_probe(&holding_charge(30_000), SIDECAR, &dirs);
        let database = format!("ledger=postgres://{ROLE}@127.0.0.1:{}/postgres", proxy.port);
        // One host, a 10 s lease: the database's idle limit (the lease's TTL) is far from the
        // moments between the row and the COMMIT, however loaded the machine.
        let host = probe_host_on("n1", &redis.url(), &dirs, ("10s", "2s"), &database, &[]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "sqlprobe", PERIOD);
        let mark = JobKeys::new("sqlprobe").data("mark/holding");
        wait_for(
            "the transaction to be open with its row",
            Duration::from_secs(60),
            || async {
                let v: Option<String> = redis::AsyncCommands::get(&mut redis.conn().await, &mark)
                    .await
                    .unwrap();
                v
            },
        )
        .await;
        // The database's answers are lost from now on; the guest commits.
        proxy.set(ProxyFault::DropReplies);
        std::fs::write(dirs.1.join("sqlprobe/release"), "").unwrap();
        let outcome = wait_for("the COMMIT's outcome", Duration::from_secs(30), || async {
            outcomes(&redis).await.get(&5).cloned()
        })
        .await;
        assert!(
            outcome.starts_with("err unavailable:")
                && outcome.contains("may or may not have been applied"),
            "{outcome}"
        );
        // It was applied.
        let token = fence_token(&pg, "sqlprobe").await;
        assert_eq!(charges(&pg).await, [("alice".to_string(), token)]);
        proxy.set(ProxyFault::None);
        let record = wait_done(&redis, Duration::from_secs(60)).await;
        assert_eq!(record["status"], "done", "{record}");
    })
    .await;
}

/// A job's statement limits: what its sidecar asks for, capped by the host's flags. Past the
/// rows or the bytes a statement may return the guest gets `too-large` (nothing returned), and a
/// statement longer than the capped time `timeout`, whatever the sidecar asked for.
#[tokio::test]
async fn results_past_the_limits_are_too_large_and_the_hosts_caps_bound_what_a_job_asks() {
    deadline(Duration::from_secs(120), async {
        let pg = prepared(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        // The sidecar asks for 10 s, 100 rows and the default 16 MiB; the host caps 1 s, 5
        // rows and 1 KiB.
        let sidecar = "[catch-up]\npolicy = \"skip\"\n[sql]\nstatement-time = \"10s\"\nmax-rows = 100\n[sql.databases]\nledger = \"ledger\"\n";
        let plan = "query ledger SELECT generate_series(1, 5)\n\
                    query ledger SELECT generate_series(1, 6)\n\
                    query ledger SELECT repeat('x', 900)\n\
                    query ledger SELECT repeat('x', 2000)\n\
                    query ledger SELECT pg_sleep(3)\n\
                    exec ledger INSERT INTO charges (customer, period, token) VALUES ($1, $2, $3) | t:after | period | token\n";
        deploy_probe(plan, sidecar, &dirs);
        let database = format!("ledger={}", pg.url(ROLE));
        let host = probe_host_on(
            "n1",
            &redis.url(),
            &dirs,
            ("2s", "500ms"),
            &database,
            &[
                ("LEASEHOLD_MAX_STATEMENT_TIME", "1s"),
                ("LEASEHOLD_MAX_SQL_ROWS", "5"),
                ("LEASEHOLD_MAX_SQL_RESULT", "1KiB"),
            ],
        );
        host.wait_for_log("became leader", Duration::from_secs(60)).await;
        trigger(&redis, "sqlprobe", PERIOD);
        let record = wait_done(&redis, Duration::from_secs(60)).await;
        assert_eq!(record["status"], "done", "{record}");
        let got = outcomes(&redis).await;
        assert_eq!(got[&1], "ok [[1],[2],[3],[4],[5]]", "{got:?}");
        assert!(got[&2].starts_with("err too-large:"), "{got:?}");
        assert!(got[&3].starts_with("ok [["), "{got:?}");
        assert!(got[&4].starts_with("err too-large:"), "{got:?}");
        assert_eq!(got[&5], "err timeout: 1000", "{got:?}");
        // The limits refuse a result, not the job: its next statement writes.
        assert_eq!(got[&6], "ok 1", "{got:?}");
        assert_eq!(charges(&pg).await.len(), 1);
    })
    .await;
}

/// Redis restarted empty while the billing sample books a run's charges in PostgreSQL, its token
/// source set back: the tokens the database saw came from a counter a day ahead of Redis's clock
/// (set directly, as a clock that was ahead and then corrected would leave it), and the restart
/// loses that counter, so every token Redis issues after it is below the database's fence. The
/// host's first term after the restart is refused by the database; the host raises the counter
/// above the database's token and campaigns again; the run carries on within a few heartbeats,
/// and every customer is booked once, with tokens that never go back in commit order.
#[tokio::test]
async fn redis_restarted_empty_with_its_token_source_set_back_costs_a_term_not_a_charge() {
    const CUSTOMERS: usize = 200;
    deadline(Duration::from_secs(240), async {
        let pg = initialised(&["billing"]).await;
        pg.exec(include_str!("../../guest-jobs/billing/ledger.sql"))
            .await;
        pg.exec(&format!(
            "GRANT SELECT, INSERT ON billing_charges TO {ROLE}"
        ))
        .await;
        let mut redis = RedisServer::start().await;
        let dir = TempDir::new("sql-redis-lost");
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        // 20 ms a charge: four steps of about a second, long enough to restart Redis in.
        std::fs::write(data.join("billing/delay-ms"), "20").unwrap();
        std::fs::write(
            jobs.join("billing.toml"),
            "[sql.databases]\nledger = \"ledger\"\n",
        )
        .unwrap();
        let keys = JobKeys::new("billing");
        let (now_s, now_us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut redis.conn().await)
            .await
            .unwrap();
        let ahead = now_s * 1_000_000 + now_us + 86_400_000_000;
        let _: () = redis::AsyncCommands::set(&mut redis.conn().await, keys.token(), ahead)
            .await
            .unwrap();
        let database = format!("ledger={}", pg.url(ROLE));
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            &jobs,
            "n0",
            ("2s", "500ms"),
            &[
                "--data-dir",
                data.to_str().unwrap(),
                "--database",
                &database,
            ],
        );
        // (period, customer, token) in commit order.
        let rows = || async {
            pg.admin()
                .await
                .unwrap()
                .query(
                    "SELECT period, customer, token FROM billing_charges \
                     ORDER BY pg_xact_commit_timestamp(xmin), customer",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r.get::<_, String>(0),
                        r.get::<_, String>(1),
                        r.get::<_, i64>(2),
                    )
                })
                .collect::<Vec<_>>()
        };
        let before = wait_for(
            "the run to have booked 30 charges",
            Duration::from_secs(90),
            || async {
                let r = rows().await;
                (r.len() >= 30).then_some(r)
            },
        )
        .await;
        let (period, old) = (before[0].0.clone(), before.last().unwrap().2);
        assert!(
            old > ahead,
            "the run's term did not take its token from the counter"
        );
        redis.crash_and_restart().await;
        wait_for(
            "a charge booked by a term after the restart",
            Duration::from_secs(60),
            || async { rows().await.iter().any(|r| r.2 > old).then_some(()) },
        )
        .await;
        host.wait_for_log("raised the token counter", Duration::from_secs(5))
            .await;
        let record = wait_for("the run to be done", Duration::from_secs(90), || async {
            let raw: Option<String> =
                redis::AsyncCommands::get(&mut redis.conn().await, keys.run(&period))
                    .await
                    .ok()?;
            let r: serde_json::Value = serde_json::from_str(&raw?).ok()?;
            (r["status"] == "done").then_some(r)
        })
        .await;
        let rows: Vec<_> = rows().await.into_iter().filter(|r| r.0 == period).collect();
        let mut customers: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        customers.sort();
        customers.dedup();
        assert_eq!(
            customers.len(),
            CUSTOMERS,
            "every customer booked: {record}"
        );
        assert_eq!(rows.len(), CUSTOMERS, "a customer booked twice");
        let tokens: Vec<i64> = rows.iter().map(|r| r.2).collect();
        assert!(
            tokens.windows(2).all(|w| w[0] <= w[1]),
            "a token went back in commit order: {tokens:?}"
        );
        // The first term after the restart had a token below the database's fence, and the
        // database refused it: no row carries it.
        let terms: Vec<i64> = host
            .log_lines_with("became leader")
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["token"].as_i64())
            .collect();
        let refused: Vec<i64> = terms.iter().copied().filter(|t| *t < old).collect();
        assert!(
            !refused.is_empty(),
            "no term below the database's fence: {terms:?}"
        );
        assert!(
            !tokens.iter().any(|t| refused.contains(t)),
            "a refused term's row landed: {tokens:?}"
        );
        let counter: i64 = redis::AsyncCommands::get(&mut redis.conn().await, keys.token())
            .await
            .unwrap();
        assert!(
            counter > old,
            "the counter {counter} is not above the database's {old}"
        );
    })
    .await;
}

#[tokio::test]
async fn db_init_is_idempotent_and_a_host_refuses_a_fence_it_cannot_trust() {
    deadline(Duration::from_secs(120), async {
        let pg = prepared(&["sqlprobe"]).await;
        let said = db_init_again(&pg.admin_url());
        assert!(said.contains("job sqlprobe: already registered"), "{said}");
        assert!(!said.contains("created"), "{said}");
        // The role given UPDATE on the fence: a host will not start on such a database.
        pg.exec(&format!("GRANT UPDATE ON leasehold.fence TO {ROLE}"))
            .await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-jobs"), TempDir::new("sql-data"));
        let mut host =
            probe_host(&pg, "", SIDECAR, "n1", &redis.url(), &dirs, ("2s", "500ms")).await;
        let status = host
            .wait_exit("the host to refuse the database", Duration::from_secs(60))
            .await;
        assert!(!status.success());
        let log = host.log().join("\n");
        assert!(log.contains("may change leasehold.fence directly"), "{log}");
        pg.exec(&format!("REVOKE UPDATE ON leasehold.fence FROM {ROLE}"))
            .await;
        // A fence function of an earlier version (one a guest could call again to raise a
        // fence): refused until `db init` replaces it.
        pg.exec(
            "CREATE OR REPLACE FUNCTION leasehold.raise_fence(p_job text, p_token bigint, p_holder text,
                 OUT raised boolean, OUT stored bigint)
             LANGUAGE plpgsql SECURITY DEFINER SET search_path = leasehold, pg_temp
             AS $fn$ BEGIN raised := true; stored := p_token; END $fn$",
        )
        .await;
        let mut host =
            probe_host(&pg, "", SIDECAR, "n3", &redis.url(), &dirs, ("2s", "500ms")).await;
        let status = host
            .wait_exit("the host to refuse the earlier function", Duration::from_secs(60))
            .await;
        assert!(!status.success());
        let log = host.log().join("\n");
        assert!(log.contains("leasehold.raise_fence is an earlier version's"), "{log}");
        let _ = db_init_again(&pg.admin_url());
        // A host without the database a job declares refuses that job, naming it.
        let jobs = TempDir::new("sql-nodb");
        std::fs::copy(guests().wasm("sqlprobe"), jobs.join("sqlprobe.wasm")).unwrap();
        std::fs::write(jobs.join("sqlprobe.toml"), SIDECAR).unwrap();
        std::fs::copy(guests().wasm("ticker"), jobs.join("ticker.wasm")).unwrap();
        let host = HostProcess::start_node(
            LEASEHOLD,
            &redis.url(),
            jobs.path(),
            "n2",
            ("2s", "500ms"),
            &["--cache-dir", dirs.1.join("cache").to_str().unwrap()],
        );
        host.wait_for_log("needs database ledger", Duration::from_secs(60))
            .await;
        // ... and serves the others.
        wait_for("n2 to lead the ticker", Duration::from_secs(60), || async {
            let owner: Option<String> =
                redis::AsyncCommands::get(&mut redis.conn().await, JobKeys::new("ticker").lease())
                    .await
                    .ok()?;
            owner.filter(|o| o.starts_with("n2:"))
        })
        .await;
        assert!(host.log_lines_with("became leader").iter().all(|l| !l.contains("sqlprobe")));
    })
    .await;
}

#[tokio::test]
async fn tls_to_postgresql_is_verified_and_an_untrusted_server_is_refused() {
    deadline(Duration::from_secs(180), async {
        let ca = TestCa::make();
        let pg = PgServer::start_tls(&ca).await;
        let root = format!("sslrootcert={}", ca.ca.display());
        // `db init` itself over TLS, trusting the CA named in its URL.
        db_init(
            &format!("{}?sslmode=verify-full&{root}", pg.admin_url()),
            &["sqlprobe"],
        );
        let plan =
            "query ledger SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()\n";
        let url = pg.url(ROLE);
        let ca_file = ca.ca.to_str().unwrap();
        // (how the database is named, the host's environment, what the probe must get)
        type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);
        let cases: [Case; 4] = [
            // `prefer` on a server that offers TLS: TLS, verified against the CA in the URL.
            (
                format!("ledger={url}?sslmode=prefer&{root}"),
                vec![],
                "ok [[true,\"TLSv1.",
            ),
            // The CA trusted through SSL_CERT_FILE, as for rediss:// URLs.
            (
                format!("ledger={url}?sslmode=require"),
                vec![("SSL_CERT_FILE", ca_file)],
                "ok [[true,\"TLSv1.",
            ),
            // The CA named in the URL.
            (
                format!("ledger={url}?sslmode=verify-full&{root}"),
                vec![],
                "ok [[true,\"TLSv1.",
            ),
            // Not trusted (the system's CAs do not include the test's): no connection, and the
            // guest is told why.
            (
                format!("ledger={url}?sslmode=require"),
                vec![],
                "err unavailable: connecting to",
            ),
        ];
        for (i, (database, env, expected)) in cases.iter().enumerate() {
            let redis = RedisServer::start().await;
            let dirs = (TempDir::new("sql-tls-jobs"), TempDir::new("sql-tls-data"));
            deploy_probe(plan, SIDECAR, &dirs);
            let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), database, env);
            host.wait_for_log("became leader", Duration::from_secs(60))
                .await;
            trigger(&redis, "sqlprobe", PERIOD);
            let record = wait_done(&redis, Duration::from_secs(120)).await;
            assert_eq!(record["status"], "done", "case {i}: {record}");
            let got = &outcomes(&redis).await[&1];
            assert!(got.starts_with(expected), "case {i} ({database}): {got}");
            if i == 3 {
                // The start-up check could not reach it either, and said why.
                let warned = host.log_lines_with("cannot check database ledger now");
                assert!(
                    warned
                        .iter()
                        .any(|l| l.contains("TLS, trusting the system's CAs")
                            && l.to_lowercase().contains("certificate")),
                    "{warned:?}"
                );
                assert!(got.to_lowercase().contains("certificate"), "{got}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn sslmode_prefer_on_a_server_without_tls_connects_in_plain_text() {
    deadline(Duration::from_secs(120), async {
        let pg = initialised(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (
            TempDir::new("sql-prefer-jobs"),
            TempDir::new("sql-prefer-data"),
        );
        deploy_probe(
            "query ledger SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()\n",
            SIDECAR,
            &dirs,
        );
        let database = format!("ledger={}?sslmode=prefer", pg.url(ROLE));
        let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "sqlprobe", PERIOD);
        let record = wait_done(&redis, Duration::from_secs(120)).await;
        assert_eq!(record["status"], "done", "{record}");
        assert_eq!(outcomes(&redis).await[&1], "ok [[false]]");
    })
    .await;
}

/// A job names the databases it uses (its `databases` export, world 0.4.3): the probe declares
/// `ledger`. On a host whose database is called `books` it is refused, naming `ledger`, until
/// its sidecar maps `ledger = "books"`; then its transactions run on `books`.
#[tokio::test]
async fn a_declared_database_is_granted_by_name_and_a_sidecar_may_map_it_to_another() {
    deadline(Duration::from_secs(150), async {
        let pg = initialised(&["sqlprobe"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-map-jobs"), TempDir::new("sql-map-data"));
        let plan = "query ledger SELECT current_user::text\n";
        deploy_probe(plan, SIDECAR, &dirs);
        let database = format!("books={}", pg.url(ROLE));
        let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("needs database ledger", Duration::from_secs(60))
            .await;
        drop(host);
        let mapped = format!("{SIDECAR}[sql.databases]\nledger = \"books\"\n");
        deploy_probe(plan, &mapped, &dirs);
        let host = probe_host_on("n2", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "sqlprobe", PERIOD);
        let record = wait_done(&redis, Duration::from_secs(90)).await;
        assert_eq!(record["status"], "done", "{record}");
        let said = &outcomes(&redis).await[&1];
        assert!(said.starts_with("ok ") && said.contains(ROLE), "{said}");
    })
    .await;
}

/// A component built to world 0.4.2 (the `oldsql` fixture: the `sql` import, no `databases`
/// export) still loads on the 0.4.3 host, through the 0.4.2 bindings, and runs: its database is
/// granted by its sidecar, as before 0.4.3, and its charge lands under its term's token.
#[tokio::test]
async fn a_component_built_to_world_0_4_2_is_granted_its_database_by_its_sidecar() {
    deadline(Duration::from_secs(120), async {
        let runtime =
            leasehold::exec::runtime::Runtime::new(leasehold::exec::spec::HostLimits::default())
                .unwrap();
        let job = runtime.load(&guests().wasm("oldsql")).await.unwrap();
        assert_eq!(job.world(), "0.4.2");
        assert!(job.spec.sql.databases.is_empty(), "it declares none");
        let pg = prepared(&["oldsql"]).await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("sql-old-jobs"), TempDir::new("sql-old-data"));
        std::fs::copy(guests().wasm("oldsql"), dirs.0.join("oldsql.wasm")).unwrap();
        std::fs::write(
            dirs.0.join("oldsql.toml"),
            format!(
                "{}[catch-up]\npolicy = \"skip\"\n[sql.databases]\nledger = \"ledger\"\n",
                crate::harness::PINNED_TO_2026
            ),
        )
        .unwrap();
        let database = format!("ledger={}", pg.url(ROLE));
        let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("became leader", Duration::from_secs(60))
            .await;
        trigger(&redis, "oldsql", PERIOD);
        let record = wait_for("the run to finish", Duration::from_secs(90), || async {
            run_record(&redis, "oldsql", PERIOD)
                .await
                .filter(|r| r["status"] == "done" || r["status"] == "failed")
        })
        .await;
        assert_eq!(record["status"], "done", "{record}");
        let token = record["token"].as_i64().unwrap();
        assert_eq!(charges(&pg).await, [("oldsql".to_string(), token)]);
        assert_eq!(token, fence_token(&pg, "oldsql").await);
    })
    .await;
}

/// The reconciliation sample granted an `accounting` database writes the day's report into its
/// `reconciliation_reports` table (`guest-jobs/reconciliation/reports.sql`): one row, under the
/// term's token (the database's own fence row holds the same), with the totals and the text
/// report the store holds.
#[tokio::test]
async fn the_reconciliation_writes_its_report_into_postgresql() {
    const DAY: &str = "2026-11-27";
    deadline(Duration::from_secs(180), async {
        let pg = initialised(&["reconciliation"]).await;
        pg.exec(include_str!("../../guest-jobs/reconciliation/reports.sql"))
            .await;
        pg.exec(&format!(
            "GRANT SELECT, INSERT, UPDATE ON reconciliation_reports TO {ROLE}"
        ))
        .await;
        let redis = RedisServer::start().await;
        let dirs = (TempDir::new("recon-pg-jobs"), TempDir::new("recon-pg-data"));
        let (jobs, data) = (&dirs.0, &dirs.1);
        deploy_sample_reconciliation(jobs.path(), data.path(), DAY);
        std::fs::write(
            jobs.join("reconciliation.toml"),
            "[catch-up]\npolicy = \"skip\"\n[sql.databases]\naccounting = \"accounting\"\n",
        )
        .unwrap();
        let database = format!("accounting={}", pg.url(ROLE));
        let host = probe_host_on("n1", &redis.url(), &dirs, ("2s", "500ms"), &database, &[]);
        host.wait_for_log("loaded job", Duration::from_secs(60))
            .await;
        trigger(&redis, "reconciliation", DAY);
        let record = wait_for("the run to be done", Duration::from_secs(90), || async {
            run_record(&redis, "reconciliation", DAY)
                .await
                .filter(|r| r["status"] == "done" || r["status"] == "failed")
        })
        .await;
        assert_eq!(record["status"], "done", "{record}");
        let rows = pg
            .admin()
            .await
            .unwrap()
            .query(
                "SELECT period, matched, missing_in_bank, net_difference_cents, report, token \
                 FROM reconciliation_reports",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "one report row for the day");
        let row = &rows[0];
        let keys = JobKeys::new("reconciliation");
        let mut conn = redis.conn().await;
        let summary: String =
            redis::AsyncCommands::get(&mut conn, keys.data(&format!("report/{DAY}")))
                .await
                .unwrap();
        let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
        let text: String =
            redis::AsyncCommands::get(&mut conn, keys.data(&format!("report/{DAY}/text")))
                .await
                .unwrap();
        assert_eq!(row.get::<_, String>(0), DAY);
        assert_eq!(
            row.get::<_, i64>(1),
            summary["totals"]["matched"].as_i64().unwrap()
        );
        assert_eq!(
            row.get::<_, i64>(2),
            summary["totals"]["missing_in_bank"].as_i64().unwrap()
        );
        assert_eq!(
            row.get::<_, i64>(3),
            summary["totals"]["net_difference_cents"].as_i64().unwrap()
        );
        assert_eq!(
            row.get::<_, String>(4),
            text,
            "the text report as the store holds it"
        );
        let token = row.get::<_, i64>(5);
        assert_eq!(
            token,
            record["token"].as_i64().unwrap(),
            "the run's term wrote it"
        );
        assert_eq!(token, fence_token(&pg, "reconciliation").await);
    })
    .await;
}
