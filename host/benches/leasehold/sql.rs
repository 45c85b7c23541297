//! The `sql` rows: a fenced transaction of one insert against the same transaction unfenced
//! (the same connection settings, plain tokio-postgres: BEGIN, INSERT, COMMIT), as a single
//! statement (`Tx::single`, the guest's `sql.execute`) and as an interactive transaction
//! (`Tx::begin`, `run`, `commit`), and many inserts
//! in one fenced transaction (multi-row `INSERT … VALUES`, 1,000 rows a statement) against one
//! fenced transaction each. In process, against the
//! harness's own PostgreSQL on loopback (fsync off: the figures are round trips, not disks).

use std::time::{Duration, Instant};

use leasehold::coord::term::Term;
use leasehold::exec::sql::{self, Databases, SqlAsk, SqlCaps, Tx, Value};
use leasehold_harness::PgServer;

use super::{Row, row, summary};

const ROLE: &str = "bench_jobs";

pub(super) async fn sql(rows: &mut Vec<Row>) {
    eprintln!("fenced PostgreSQL transactions");
    let pg = PgServer::start().await;
    let admin = pg.admin().await.unwrap();
    sql::fence::init(&admin, ROLE, &["bench".to_string()])
        .await
        .unwrap();
    pg.exec(&format!(
        "CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL); GRANT SELECT, INSERT ON t TO {ROLE};"
    ))
    .await;
    let cfg = sql::parse_database(&format!("bench={}", pg.url(ROLE))).unwrap();
    let dbs = Databases::new(&[cfg], SqlCaps::default(), Duration::from_secs(10));
    let ask = SqlAsk {
        databases: [("bench".to_string(), "bench".to_string())].into(),
        ..SqlAsk::default()
    };
    let job = dbs.for_job(&ask);
    let db = job.granted["bench"].clone();
    let term = Term::new(
        7,
        "bench:1".into(),
        Instant::now() + Duration::from_secs(3600),
    );
    let insert = "INSERT INTO t (id, v) VALUES ($1, $2)";
    let plain = pg.connect(ROLE).await.unwrap();
    let stmt = plain.prepare(insert).await.unwrap();
    let n = 3000i64;
    let value = "x".repeat(100);
    let (mut unfenced, mut fenced, mut single, mut autocommit) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut id = 0i64;
    // Interleaved, so that both see the same machine.
    for _ in 0..n {
        id += 1;
        let t = Instant::now();
        plain.batch_execute("BEGIN").await.unwrap();
        plain.execute(&stmt, &[&id, &value]).await.unwrap();
        plain.batch_execute("COMMIT").await.unwrap();
        unfenced.push(t.elapsed().as_secs_f64() * 1e6);
        id += 1;
        let t = Instant::now();
        let mut tx = Tx::begin("bench", &db, "bench", &term, job.limits)
            .await
            .unwrap();
        tx.run(insert, &[Value::Int(id), Value::Text(value.clone())], true)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        fenced.push(t.elapsed().as_secs_f64() * 1e6);
        id += 1;
        let t = Instant::now();
        Tx::single(
            "bench",
            &db,
            "bench",
            &term,
            job.limits,
            insert,
            &[Value::Int(id), Value::Text(value.clone())],
            true,
        )
        .await
        .unwrap();
        single.push(t.elapsed().as_secs_f64() * 1e6);
        // For scale: the insert on its own, committed by the server (one round trip).
        id += 1;
        let t = Instant::now();
        plain.execute(&stmt, &[&id, &value]).await.unwrap();
        autocommit.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (_, u_med, u_p99) = summary(&mut unfenced);
    let (_, f_med, f_p99) = summary(&mut fenced);
    let (_, s_med, s_p99) = summary(&mut single);
    let (_, a_med, _) = summary(&mut autocommit);
    rows.push(row(
        "fenced PostgreSQL transaction of one insert (`sql.execute`: fence and insert in one round trip, then COMMIT)",
        format!(
            "median {s_med:.0} / p99 {s_p99:.0} µs ({:.2}× unfenced)",
            s_med / u_med
        ),
        &format!(
            "BEGIN, INSERT, COMMIT unfenced: median {u_med:.0} / p99 {u_p99:.0} µs (the INSERT alone, autocommitted, one round trip: median {a_med:.0} µs)"
        ),
        "≤ 1.3 × unfenced",
        Some(s_med <= 1.3 * u_med),
    ));
    rows.push(row(
        "the same as an interactive transaction (`begin`, `execute`, `commit`: three round trips, as unfenced)",
        format!(
            "median {f_med:.0} / p99 {f_p99:.0} µs ({:.2}× unfenced)",
            f_med / u_med
        ),
        "the same unfenced transaction",
        "stated (`begin` returns once the fence is raised)",
        None,
    ));
    // Many inserts per fenced transaction (multi-row INSERTs of 1,000 rows, one statement each)
    // against one fenced transaction per insert.
    let many = 10_000i64;
    let per = 1000usize;
    let multi = format!(
        "INSERT INTO t (id, v) VALUES {}",
        (0..per)
            .map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let t = Instant::now();
    let mut tx = Tx::begin("bench", &db, "bench", &term, job.limits)
        .await
        .unwrap();
    for _ in 0..many as usize / per {
        let mut params = Vec::with_capacity(2 * per);
        for _ in 0..per {
            id += 1;
            params.push(Value::Int(id));
            params.push(Value::Text(value.clone()));
        }
        tx.run(&multi, &params, true).await.unwrap();
    }
    tx.commit().await.unwrap();
    let batched = many as f64 / t.elapsed().as_secs_f64();
    let each = 1e6 / f_med;
    rows.push(row(
        "10,000 inserts in one fenced transaction (multi-row INSERTs of 1,000)",
        format!(
            "{batched:.0}/s ({:.0}× one transaction each)",
            batched / each
        ),
        &format!("one fenced transaction per insert: {each:.0}/s"),
        "≥ 20 × one each",
        Some(batched >= 20.0 * each),
    ));
}
