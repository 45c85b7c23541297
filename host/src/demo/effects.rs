//! The demo's scenes of the fence beyond Redis: the same two terms (the frozen leader's and its
//! successor's) write to a PostgreSQL of the demo's own through the `sql` import, and call a
//! fenced HTTP receiver through the host's outbound sender. Each scene sends the zombie's late
//! effect exactly as its host would (its token, and a clock that says it still leads), so what
//! refuses it is the database or the receiver, not the host's deadline.

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use leasehold_harness::{PgServer, Receiver};

use leasehold::coord::term::Term;
use leasehold::exec::http::{Destination, HttpAsk, HttpCaps, HttpHooks, Outbound};
use leasehold::exec::sql::{self, Databases, SqlAsk, SqlCaps, SqlError, SqlLimits, Tx};

use super::{DEMO_PERIOD, Demo, JOB};

/// A deadline far enough away that the host's clock never stops the scene's terms.
fn lasting() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// The fence inside PostgreSQL (the `sql` import): a database of the demo's own, prepared as
/// `leasehold db init` prepares one; the successor's term books the day's report in a
/// transaction that raises the database's fence to its token; then the zombie's transaction,
/// sent exactly as its host would send it (its token, and a clock that says it still leads),
/// is refused by the database.
pub(super) async fn postgres_scene(
    demo: &Demo,
    (name_a, token_a, owner_a): (&str, u64, &str),
    (name_b, token_b, owner_b): (&str, u64, &str),
) -> anyhow::Result<()> {
    const ROLE: &str = "lh_demo";
    let pg = PgServer::start().await;
    let admin = pg
        .admin()
        .await
        .context("connecting to the demo's PostgreSQL")?;
    sql::fence::init(&admin, ROLE, &[JOB.to_string()])
        .await
        .context("preparing the fence")?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE reports (period text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL);
             GRANT SELECT, INSERT ON reports TO {ROLE}"
        ))
        .await?;
    let cfg = sql::parse_database(&format!("ledger={}", pg.url(ROLE))).map_err(|e| anyhow!(e))?;
    let dbs = Databases::new(&[cfg], SqlCaps::default(), Duration::from_secs(2));
    let ask = SqlAsk {
        databases: [("ledger".to_string(), "ledger".to_string())].into(),
        ..SqlAsk::default()
    };
    let db = dbs.for_job(&ask).granted["ledger"].clone();
    let limits = SqlLimits {
        statement_time: Duration::from_secs(5),
        rows: 10,
        result_bytes: 1 << 20,
        idle: Duration::from_secs(2),
    };
    // Both terms with a clock that says they lead: only the database decides.
    let successor = Term::new(token_b, owner_b.to_string(), lasting());
    let book = "INSERT INTO reports (period, body, token) VALUES ($1, $2, $3)";
    let mut tx = Tx::begin("ledger", &db, JOB, &successor, limits)
        .await
        .map_err(|e| anyhow!("the successor's transaction: {e}"))?;
    tx.run(
        book,
        &[
            sql::Value::Text(DEMO_PERIOD.into()),
            sql::Value::Text(format!("report by {name_b}")),
            sql::Value::Int(token_b as i64),
        ],
        true,
    )
    .await
    .map_err(|e| anyhow!("booking the report: {e}"))?;
    tx.commit()
        .await
        .map_err(|e| anyhow!("committing the report: {e}"))?;
    demo.say(&format!(
        "Jobs that write to PostgreSQL (the `sql` import) carry the same fence into the database. In a PostgreSQL of the demo's own, prepared by `leasehold db init`, {name_b}'s term booked the day's report in a transaction that first raised the database's fence row to {token_b}, inside that transaction."
    ));
    let zombie = Term::new(token_a, owner_a.to_string(), lasting());
    match Tx::begin("ledger", &db, JOB, &zombie, limits).await {
        Err(e @ SqlError::Fenced { .. }) => demo.say(&format!(
            "{name_a}'s late transaction, sent as its host sends one (token {token_a}, and a clock that says it still leads): refused by PostgreSQL itself — {e}. Nothing of it was written."
        )),
        Ok(_) => bail!("PostgreSQL began a transaction with the old token {token_a}: this is a bug"),
        Err(e) => bail!("the zombie's transaction: {e}"),
    }
    let rows = admin
        .query(
            "SELECT token FROM reports WHERE period = $1",
            &[&DEMO_PERIOD],
        )
        .await?;
    if rows.len() != 1 || rows[0].get::<_, i64>(0) != token_b as i64 {
        bail!("the database's reports are not the successor's one row");
    }
    Ok(())
}

/// The fence carried over HTTP: a fenced receiver (the harness's, which keeps the highest
/// `Leasehold-Token` per job, as the README's recipe says) takes the successor's request, sent
/// through the host's outbound sender with its token in headers the job cannot set, and refuses
/// the zombie's late one with `409`.
pub(super) async fn http_scene(
    demo: &Demo,
    (name_a, token_a, owner_a): (&str, u64, &str),
    (name_b, token_b, owner_b): (&str, u64, &str),
) -> anyhow::Result<()> {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let dest = Destination::parse(&url).map_err(|e| anyhow!(e))?;
    // The receiver listens on loopback, which a host refuses unless told otherwise.
    let outbound = Outbound::new(HttpCaps {
        allow: vec![dest.clone()],
        private: true,
        ..HttpCaps::default()
    });
    let granted = outbound.for_job(&HttpAsk {
        allow: vec![dest],
        ..HttpAsk::default()
    });
    let charge = format!("{url}/charge");
    let key = format!("{DEMO_PERIOD}/report");
    let send = |token: u64, owner: &str| {
        let hooks = HttpHooks::for_step(
            JOB,
            DEMO_PERIOD,
            Term::new(token, owner.to_string(), lasting()),
            granted.clone(),
        );
        let charge = charge.clone();
        let key = key.clone();
        async move {
            hooks
                .send_whole(
                    http::Method::POST,
                    &charge,
                    &[("idempotency-key", key.as_str())],
                    br#"{"report":"filed"}"#.to_vec(),
                )
                .await
        }
    };
    let (status, _) = send(token_b, owner_b)
        .await
        .map_err(|e| anyhow!("the successor's request: {e:?}"))?;
    if status != 200 {
        bail!("the receiver answered the successor's request {status}");
    }
    demo.say(&format!(
        "Jobs that call HTTP services (`wasi:http`, to granted destinations only) carry the token too: the host adds Leasehold-Job, Leasehold-Period and Leasehold-Token headers the job cannot set. {name_b}'s term filed the day's report with a fenced receiver (a payment provider's stand-in): accepted, {status}; the receiver now knows token {token_b}."
    ));
    let (status, body) = send(token_a, owner_a)
        .await
        .map_err(|e| anyhow!("the zombie's request: {e:?}"))?;
    if status != 409 {
        bail!("the receiver answered the old token {token_a} with {status}: this is a bug");
    }
    demo.say(&format!(
        "{name_a}'s late request, sent as its host sends one (token {token_a}, a clock that says it still leads): refused by the receiver, {status} Conflict — {}.",
        String::from_utf8_lossy(&body)
    ));
    let applied = receiver.applied();
    if applied.len() != 1 || applied.get(&key) != Some(&token_b) {
        bail!("the receiver applied {applied:?}, not the successor's one request");
    }
    Ok(())
}
