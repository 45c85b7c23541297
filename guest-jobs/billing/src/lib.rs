//! Daily billing: charge every customer exactly once per period.
//!
//! Inputs (read-only, `<data-dir>/billing/`): `customers.csv` with a header and one
//! `customer,amount_cents` line per customer; optionally `delay-ms`, a pause per customer that
//! stands in for a slow payment provider (tests use it to interrupt a step mid-way), and
//! `provider`, the URL of a payment provider to charge through.
//!
//! Each step charges the next [`CHUNK`] customers. Where a charge is booked:
//!
//! * **In PostgreSQL**, when the host grants the job a database named `ledger` (sidecar
//!   `[sql.databases] ledger = "…"`): one row per customer and period in `billing_charges`
//!   (`ledger.sql` beside this crate, created by the operator), inserted with `ON CONFLICT DO NOTHING`
//!   in a transaction the database fences with the term's token, which the row also records.
//! * **In the store** otherwise: `store.create` under the idempotency key
//!   `charge/<period>/<customer>`.
//!
//! When `provider` holds a URL (granted in the sidecar's `[http] allow`), each customer is first
//! charged at that payment provider: a `POST` with an `Idempotency-Key` of
//! `<period>/<customer>`, through the host, which adds the term's token. The provider applies a
//! key once, so a re-executed step's repeated request charges nothing twice; a fenced provider
//! answers a replaced leader `409`, which ends the term like a `fenced` store write. The charge is
//! booked only after the provider accepted it.
//!
//! Either way, when a step is re-executed (after a failover or a retry) the charges it already
//! made exist and are not made again. The last step reads every charge back and writes
//! `summary/<period>` to the store.
//!
//! State between steps: `next_index charged already` as text.

use std::time::Duration;

use leasehold_guest::http;
use leasehold_guest::prelude::*;
use leasehold_guest::sql::{self, SqlError, Value};
use leasehold_guest::store;

/// The database name the job asks for.
const LEDGER: &str = "ledger";

/// Customers per step.
const CHUNK: usize = 50;

struct Billing;

impl Guest for Billing {
    fn describe() -> JobSpec {
        spec("billing")
            .schedule("0 0 3 * * *")
            .time_zone("Europe/London")
            .max_step_time(Duration::from_secs(60))
            // A billing day is never skipped: a week of missed days is caught up, oldest first.
            .catch_up(CatchUp::All, Duration::from_secs(7 * 86_400))
            .retry(3, Duration::from_secs(60))
            .retry_max_backoff(Duration::from_secs(600))
            .build()
    }

    /// None declared: the PostgreSQL sink is optional (a sidecar's `[sql.databases]` grants it);
    /// declared, a host without it would refuse the job.
    fn databases() -> Vec<String> {
        Vec::new()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        _step: u32,
        state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let customers = read_customers()?;
        let (next, mut charged, mut already) = parse_state(state)?;
        let delay = std::fs::read_to_string("/data/delay-ms")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(std::time::Duration::from_millis);
        let provider = std::fs::read_to_string("/data/provider")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        if next >= customers.len() {
            return summarize(&run.period, &customers, charged, already);
        }
        let end = (next + CHUNK).min(customers.len());
        let mut ledger = None;
        for (customer, amount) in &customers[next..end] {
            term.ensure_leader()?;
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            if let Some(url) = &provider {
                charge_at_provider(term, &run, url, customer, *amount)?;
            }
            let created = match ledger {
                Some(Ledger::Store) => charge_in_store(term, &run, customer, *amount)?,
                Some(Ledger::Postgres) => charge_in_ledger(term, &run, customer, *amount)?
                    .ok_or_else(|| JobError::Failed("the ledger database went away".into()))?,
                None => match charge_in_ledger(term, &run, customer, *amount)? {
                    Some(created) => {
                        ledger = Some(Ledger::Postgres);
                        created
                    }
                    None => {
                        ledger = Some(Ledger::Store);
                        charge_in_store(term, &run, customer, *amount)?
                    }
                },
            };
            if created {
                charged += 1;
            } else {
                already += 1;
            }
        }
        Ok(StepOutcome::Continue(
            format!("{end} {charged} {already}").into_bytes(),
        ))
    }
}

/// Where this host books charges.
#[derive(Clone, Copy)]
enum Ledger {
    Postgres,
    Store,
}

/// Charges one customer at the payment provider, once per period whatever the retries: the
/// provider applies each `Idempotency-Key` once. `409` from a fenced provider means a newer term
/// has charged there: this one has lost leadership.
fn charge_at_provider(
    term: &Term,
    run: &RunInfo,
    url: &str,
    customer: &str,
    amount: u64,
) -> Result<(), JobError> {
    let key = format!("{}/{customer}", run.period);
    let body = format!(r#"{{"customer":"{customer}","amount_cents":{amount}}}"#);
    let sent = http::send(
        "POST",
        url,
        &[
            ("idempotency-key", &key),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    let got = match sent {
        Ok(got) => got,
        Err(e) => {
            // The host refuses requests once the term's deadline has passed: say so as a lost
            // term, and any other failure as a failed attempt (retried).
            term.ensure_leader()?;
            return Err(JobError::Failed(format!("charging {customer}: {e}")));
        }
    };
    if got.is_stale_term() {
        return Err(JobError::LostLeadership);
    }
    if !got.is_success() {
        return Err(JobError::Failed(format!(
            "charging {customer}: the provider answered {} {}",
            got.status,
            got.text()
        )));
    }
    Ok(())
}

/// Books one charge in the store; whether it was new.
fn charge_in_store(
    term: &Term,
    run: &RunInfo,
    customer: &str,
    amount: u64,
) -> Result<bool, JobError> {
    let key = format!("charge/{}/{customer}", run.period);
    let value = format!("{amount} token={} attempt={}", term.token(), run.attempt);
    // Any refusal but a lost term fails the attempt (retried under the retry policy).
    store::create(&key, value.as_bytes())
        .lost_leadership_or_else(|e| JobError::Failed(format!("charging {customer}: {e:?}")))
}

/// Books one charge in the `ledger` database; whether it was new, or `None` when the host
/// grants no such database. A lost COMMIT reply (`unavailable`) fails the attempt; the retry's
/// `ON CONFLICT DO NOTHING` finds the row if it was applied.
fn charge_in_ledger(
    term: &Term,
    run: &RunInfo,
    customer: &str,
    amount: u64,
) -> Result<Option<bool>, JobError> {
    let params = [
        Value::Text(run.period.clone()),
        Value::Text(customer.to_string()),
        Value::Int(amount as i64),
        Value::Int(term.token() as i64),
        Value::Int(i64::from(run.attempt)),
    ];
    match sql::execute(
        LEDGER,
        "INSERT INTO billing_charges (period, customer, amount_cents, token, attempt) \
         VALUES ($1, $2, $3, $4, $5::integer) ON CONFLICT (period, customer) DO NOTHING",
        &params,
    ) {
        Ok(n) => Ok(Some(n == 1)),
        Err(SqlError::NotGranted(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The customers, in file order: (id, amount in cents).
fn read_customers() -> Result<Vec<(String, u64)>, JobError> {
    let text = std::fs::read_to_string("/data/customers.csv")
        .map_err(|e| JobError::NotReady(format!("/data/customers.csv: {e}")))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let (id, amount) = line.split_once(',').ok_or_else(|| {
            JobError::Failed(format!(
                "customers.csv line {}: expected customer,amount_cents",
                n + 1
            ))
        })?;
        let amount = amount.trim().parse().map_err(|_| {
            JobError::Failed(format!(
                "customers.csv line {}: amount {amount:?} is not a whole number of cents",
                n + 1
            ))
        })?;
        out.push((id.trim().to_string(), amount));
    }
    Ok(out)
}

fn parse_state(state: Option<Vec<u8>>) -> Result<(usize, u64, u64), JobError> {
    let Some(state) = state else {
        return Ok((0, 0, 0));
    };
    let text =
        String::from_utf8(state).map_err(|_| JobError::Failed("checkpoint is not text".into()))?;
    let parts: Vec<u64> = text.split(' ').filter_map(|p| p.parse().ok()).collect();
    match parts[..] {
        [next, charged, already] => Ok((next as usize, charged, already)),
        _ => Err(JobError::Failed(format!(
            "checkpoint {text:?} is not `next charged already`"
        ))),
    }
}

/// Reads every charge of the period back and writes the summary.
fn summarize(
    period: &str,
    customers: &[(String, u64)],
    charged: u64,
    already: u64,
) -> Result<StepOutcome, JobError> {
    let (found, total) = match ledger_totals(period)? {
        Some(totals) => totals,
        None => store_totals(period, customers)?,
    };
    if found != customers.len() as u64 {
        return Err(JobError::Failed(format!(
            "{period}: {found} charges booked for {} customers",
            customers.len()
        )));
    }
    let summary = format!(
        "customers={found} total_cents={total} charged_by_this_attempt={charged} found_already={already}"
    );
    store::write(&format!("summary/{period}"), summary.as_bytes())
        .lost_leadership_or_else(|e| JobError::Failed(format!("writing the summary: {e:?}")))?;
    Ok(StepOutcome::Done)
}

/// (charges, total cents) of the period in the `ledger` database, or `None` when none is granted.
fn ledger_totals(period: &str) -> Result<Option<(u64, u64)>, JobError> {
    let rows = match sql::query(
        LEDGER,
        "SELECT count(*), coalesce(sum(amount_cents), 0)::bigint FROM billing_charges WHERE period = $1",
        &[Value::Text(period.to_string())],
    ) {
        Ok(rows) => rows,
        Err(SqlError::NotGranted(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match rows.rows.first().map(|r| &r[..]) {
        Some([Value::Int(n), Value::Int(total)]) => Ok(Some((*n as u64, *total as u64))),
        other => Err(JobError::Failed(format!(
            "billing_charges totals came back as {other:?}"
        ))),
    }
}

/// (charges, total cents) of the period in the store.
fn store_totals(period: &str, customers: &[(String, u64)]) -> Result<(u64, u64), JobError> {
    let mut total = 0u64;
    let mut found = 0u64;
    for (customer, _) in customers {
        let key = format!("charge/{period}/{customer}");
        match store::read(&key) {
            Ok(Some(v)) => {
                found += 1;
                let text = String::from_utf8_lossy(&v);
                total += text
                    .split(' ')
                    .next()
                    .and_then(|a| a.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            Ok(None) => {
                return Err(JobError::Failed(format!(
                    "customer {customer} has no charge for {period}"
                )));
            }
            Err(e) => return Err(JobError::Failed(format!("reading {key}: {e:?}"))),
        }
    }
    Ok((found, total))
}

leasehold_guest::export!(Billing);
