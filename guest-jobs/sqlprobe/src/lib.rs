//! Test fixture: runs the plan in `/data/plan.txt` through the `sql` import, one line per
//! operation, and records each outcome under `result/<period>/<line>` in its store, so a test
//! can see what the host and the database did with each statement.
//!
//! Lines (blank lines and `#` comments skipped):
//!
//! * `exec DB SQL [| P…]`, `query DB SQL [| P…]` — a single statement in its own transaction;
//! * `begin DB`, `tx SQL [| P…]`, `txq SQL [| P…]`, `commit`, `drop` — an interactive
//!   transaction (`tx` executes, `txq` queries);
//! * `mark KEY` — writes `mark/KEY` (fenced, in Redis) so a test knows how far the step got;
//! * `hold MS` — spins for MS milliseconds (a test freezes the host meanwhile), or until
//!   `/data/release` exists;
//!
//! Parameters `P`, separated by `|`: `i:5`, `f:1.5`, `t:text`, `b:true`, `x:hex`, `null`,
//! `period` (the run's period as text), `token` (the term's token as an int).
//!
//! Outcomes: `ok N` (rows changed), `ok [[...],...]` (rows, as JSON-ish text), or
//! `err CASE: message`.

use leasehold_guest::prelude::*;
use leasehold_guest::sql::{self, SqlError, Transaction, Value};

struct SqlProbe;

fn spec_of() -> JobSpec {
    spec("sqlprobe").schedule("0 0 0 1 1 *").build()
}

fn error(e: &SqlError) -> String {
    let db = |d: &sql::DatabaseError| {
        format!(
            "{} {} constraint={}",
            d.code,
            d.message,
            d.constraint.clone().unwrap_or_default()
        )
    };
    match e {
        SqlError::NotGranted(m) => format!("not-granted: {m}"),
        SqlError::Refused(m) => format!("refused: {m}"),
        SqlError::Constraint(d) => format!("constraint: {}", db(d)),
        SqlError::Database(d) => format!("database: {}", db(d)),
        SqlError::Timeout(ms) => format!("timeout: {ms}"),
        SqlError::TooLarge(m) => format!("too-large: {m}"),
        SqlError::Unsupported(m) => format!("unsupported: {m}"),
        SqlError::Fenced(m) => format!("fenced: {m}"),
        SqlError::NotLeader => "not-leader: ".into(),
        SqlError::Unavailable(m) => format!("unavailable: {m}"),
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Boolean(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(s) => format!("{s:?}"),
        Value::Bytes(b) => format!(
            "x{}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        ),
    }
}

fn rows(r: &sql::Rows) -> String {
    let rows: Vec<String> = r
        .rows
        .iter()
        .map(|row| format!("[{}]", row.iter().map(show).collect::<Vec<_>>().join(",")))
        .collect();
    format!("[{}]", rows.join(","))
}

fn params(text: &str, term: &Term, run: &RunInfo) -> Vec<Value> {
    text.split('|')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once(':') {
            Some(("i", v)) => Value::Int(v.parse().expect("i:")),
            Some(("f", v)) => Value::Float(v.parse().expect("f:")),
            Some(("t", v)) => Value::Text(v.to_string()),
            Some(("b", v)) => Value::Boolean(v == "true"),
            Some(("x", v)) => Value::Bytes(
                (0..v.len() / 2)
                    .map(|i| u8::from_str_radix(&v[2 * i..2 * i + 2], 16).expect("x:"))
                    .collect(),
            ),
            _ if p == "null" => Value::Null,
            _ if p == "period" => Value::Text(run.period.clone()),
            _ if p == "token" => Value::Int(term.token() as i64),
            _ => panic!("unknown parameter {p:?}"),
        })
        .collect()
}

impl Guest for SqlProbe {
    fn describe() -> JobSpec {
        spec_of()
    }

    /// Every plan runs on `ledger`: a host without one refuses the probe, naming it.
    fn databases() -> Vec<String> {
        vec!["ledger".into()]
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        _step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let plan = std::fs::read_to_string("/data/plan.txt")
            .map_err(|e| JobError::Failed(format!("cannot read /data/plan.txt: {e}")))?;
        let mut tx: Option<Transaction> = None;
        for (n, line) in plan.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
            let (stmt, ps) = rest.split_once(" | ").unwrap_or((rest, ""));
            let ps = params(ps, term, &run);
            let outcome = match op {
                "exec" | "query" => {
                    let (db, stmt) = stmt.split_once(' ').unwrap_or((stmt, ""));
                    if op == "exec" {
                        sql::execute(db, stmt, &ps).map(|n| format!("ok {n}"))
                    } else {
                        sql::query(db, stmt, &ps).map(|r| format!("ok {}", rows(&r)))
                    }
                }
                "begin" => sql::begin(stmt).map(|t| {
                    tx = Some(t);
                    "ok begun".to_string()
                }),
                "tx" => tx
                    .as_ref()
                    .expect("tx without begin")
                    .execute(stmt, &ps)
                    .map(|n| format!("ok {n}")),
                "txq" => tx
                    .as_ref()
                    .expect("txq without begin")
                    .query(stmt, &ps)
                    .map(|r| format!("ok {}", rows(&r))),
                "commit" => Transaction::commit(tx.take().expect("commit without begin"))
                    .map(|()| "ok committed".to_string()),
                "drop" => {
                    drop(tx.take());
                    Ok("ok dropped".to_string())
                }
                "mark" => {
                    leasehold_guest::store::write(&format!("mark/{stmt}"), b"1")?;
                    Ok("ok marked".to_string())
                }
                "hold" => {
                    let until = std::time::Instant::now()
                        + std::time::Duration::from_millis(stmt.parse().expect("hold MS"));
                    let mut looked = std::time::Instant::now();
                    while std::time::Instant::now() < until {
                        if looked.elapsed() >= std::time::Duration::from_millis(10) {
                            if std::path::Path::new("/data/release").exists() {
                                break;
                            }
                            looked = std::time::Instant::now();
                        }
                        std::hint::spin_loop();
                    }
                    Ok("ok held".to_string())
                }
                other => panic!("unknown operation {other:?}"),
            };
            let text = match &outcome {
                Ok(t) => t.clone(),
                Err(e) => format!("err {}", error(e)),
            };
            leasehold_guest::store::write(
                &format!("result/{}/{:03}", run.period, n + 1),
                text.as_bytes(),
            )?;
            if let Err(SqlError::Fenced(_) | SqlError::NotLeader) = outcome {
                return Err(JobError::LostLeadership);
            }
        }
        Ok(StepOutcome::Done)
    }
}

leasehold_guest::export!(SqlProbe);
