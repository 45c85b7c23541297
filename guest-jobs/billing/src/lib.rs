//! Daily billing: charge every customer exactly once per period.
//!
//! Inputs (read-only, `<data-dir>/billing/`): `customers.csv` with a header and one
//! `customer,amount_cents` line per customer; optionally `delay-ms`, a pause per customer that
//! stands in for a slow payment provider (tests use it to interrupt a step mid-way).
//!
//! Each step charges the next [`CHUNK`] customers. A charge is recorded with `store.create`
//! under the idempotency key `charge/<period>/<customer>`: when a step is re-executed (after a
//! failover or a retry) the charges it already made exist and are not made again. The last step
//! reads every charge back and writes `summary/<period>`.
//!
//! State between steps: `next_index charged already` as text.

use std::time::Duration;

use leasehold_guest::prelude::*;
use leasehold_guest::store;

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
        if next >= customers.len() {
            return summarize(&run.period, &customers, charged, already);
        }
        let end = (next + CHUNK).min(customers.len());
        for (customer, amount) in &customers[next..end] {
            term.ensure_leader()?;
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            let key = format!("charge/{}/{customer}", run.period);
            let value = format!("{amount} token={} attempt={}", term.token(), run.attempt);
            // Any refusal but a lost term fails the attempt (retried under the retry policy).
            let created = store::create(&key, value.as_bytes()).lost_leadership_or_else(|e| {
                JobError::Failed(format!("charging {customer}: {e:?}"))
            })?;
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
    let summary = format!(
        "customers={found} total_cents={total} charged_by_this_attempt={charged} found_already={already}"
    );
    store::write(&format!("summary/{period}"), summary.as_bytes())
        .lost_leadership_or_else(|e| JobError::Failed(format!("writing the summary: {e:?}")))?;
    Ok(StepOutcome::Done)
}

leasehold_guest::export!(Billing);
