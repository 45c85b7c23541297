//! Daily settlement export: the Rust twin of the Python job in `guest-jobs/settlement-py`
//! (`app.py`), step for step. The benchmark runs both to compare the time of a step in the two
//! languages, and a test runs both on the same payments and checks that their exports are the
//! same bytes.
//!
//! Inputs (read-only, `<data-dir>/settlement-rs/`): `payments.csv` with a header and one
//! `payment_id,merchant,amount_cents` line per captured payment; optionally `delay-ms`, a
//! pause per payment that stands in for a slow ledger (tests use it to kill a leader mid-run).
//! The CSV is read as Python's `csv.reader` reads it (see [`python`]): the first record is the
//! header, records whose fields are all blank are skipped, and each field is trimmed.
//!
//! Each step settles the next [`CHUNK`] payments into per-merchant totals, which travel in the
//! checkpoint (JSON, [`Progress`]), so a run resumed on another replica carries on where the
//! last completed step stopped. The last step records one payout per merchant with
//! `store.create` under the idempotency key `payout/<period>/<merchant>` (a re-executed step
//! never pays twice) and writes the export `export/<period>` with `store.write`:
//!
//! ```text
//! settlement <period>: <payments> payments, <merchants> merchants
//! <merchant> <total cents>        (one line per merchant, sorted)
//! total <sum of the totals>
//! ```
//!
//! Rust has no exception to leave uncaught: where the Python job raises `ValueError` (a line
//! that does not parse, say), this one returns [`JobError::Failed`] with the reason, e.g.
//! `payments.csv line 7: amount "12x" is not a whole number of cents`, which the run's record
//! keeps (`leasehold runs settlement-rs`).
//!
//! Amounts are whole cents in a `u64`, where Python's `int` is signed and unbounded: a
//! negative amount, or one (or a merchant's total) past `u64::MAX`, fails the step here.

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_guest::prelude::*;
use leasehold_guest::{log, state, store};

mod python;

/// Payments per step.
const CHUNK: usize = 25;
const PAYMENTS: &str = "/data/payments.csv";
const DELAY: &str = "/data/delay-ms";

/// The checkpoint between steps.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Progress {
    /// Index of the first payment not settled yet.
    next: usize,
    /// Cents settled so far, per merchant.
    totals: BTreeMap<String, u64>,
}

/// One payment: (merchant, amount in cents). The payment id is read and not used.
type Payment = (String, u64);

struct Settlement;

impl Guest for Settlement {
    fn describe() -> JobSpec {
        spec("settlement-rs")
            .schedule("0 0 4 * * *")
            .time_zone("UTC")
            .max_step_time(Duration::from_secs(60))
            .build()
    }

    fn databases() -> Vec<String> {
        Vec::new()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        _step: u32,
        state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let payments = read_payments()?;
        let mut progress: Progress = state::load(state)?;
        let start = progress.next;
        if start >= payments.len() {
            return finish(term, &run, &progress.totals, payments.len());
        }
        let pause = delay()?;
        let end = (start + CHUNK).min(payments.len());
        for (merchant, amount) in &payments[start..end] {
            term.ensure_leader()?;
            if pause != 0 {
                // Python's `time.sleep` refuses a negative pause when it is first taken.
                if pause < 0 {
                    return Err(JobError::Failed(format!(
                        "{DELAY}: sleep length must be non-negative"
                    )));
                }
                std::thread::sleep(Duration::from_millis(
                    u64::try_from(pause).unwrap_or(u64::MAX),
                ));
            }
            let total = progress.totals.entry(merchant.clone()).or_default();
            *total = total.checked_add(*amount).ok_or_else(|| {
                JobError::Failed(format!(
                    "the total of merchant {merchant:?} is past {} cents",
                    u64::MAX
                ))
            })?;
        }
        log::write(
            log::Level::Info,
            &format!("settled payments {start}..{end} of {}", payments.len()),
        );
        progress.next = end;
        state::save(&progress)
    }
}

/// The payments in file order. An unreadable file is [`JobError::NotReady`] (`<path>: <the
/// OS's reason>`, as Python's `strerror`); a record that is not three fields, or an amount that
/// is not a whole number of cents, is [`JobError::Failed`] naming its record number (the line
/// number when no quoted field spans lines), counted from 1 with the header.
fn read_payments() -> Result<Vec<Payment>, JobError> {
    let bytes = std::fs::read(PAYMENTS)
        .map_err(|e| JobError::NotReady(format!("{PAYMENTS}: {}", strerror(&e))))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| JobError::Failed(format!("{PAYMENTS}: not UTF-8 text: {e}")))?;
    let records =
        python::csv_records(&text).map_err(|e| JobError::Failed(format!("{PAYMENTS}: {e}")))?;
    let mut out = Vec::new();
    for (number, record) in records.iter().enumerate().skip(1) {
        let number = number + 1;
        if record.iter().all(|field| python::strip(field).is_empty()) {
            continue;
        }
        let [_payment, merchant, amount] = &record[..] else {
            return Err(JobError::Failed(format!(
                "payments.csv line {number}: expected payment_id,merchant,amount_cents"
            )));
        };
        let amount = python::strip(amount);
        let cents = match python::int(amount) {
            None => Err("is not a whole number of cents"),
            Some(cents) if cents < 0 => Err("is negative"),
            Some(cents) => u64::try_from(cents).map_err(|_| "is too large"),
        }
        .map_err(|why| {
            JobError::Failed(format!(
                "payments.csv line {number}: amount {amount:?} {why}"
            ))
        })?;
        out.push((python::strip(merchant).to_string(), cents));
    }
    Ok(out)
}

/// The pause per payment in milliseconds (as Python's `int` reads `delay-ms`): 0 when the file
/// cannot be read, [`JobError::Failed`] when it holds no whole number.
fn delay() -> Result<i128, JobError> {
    let Ok(bytes) = std::fs::read(DELAY) else {
        return Ok(0);
    };
    let text = String::from_utf8(bytes)
        .map_err(|e| JobError::Failed(format!("{DELAY}: not UTF-8 text: {e}")))?;
    python::int(&text).ok_or_else(|| {
        JobError::Failed(format!(
            "{DELAY}: {:?} is not a whole number of milliseconds",
            python::strip(&text)
        ))
    })
}

/// What Python's `OSError.strerror` says for `e`: Rust's message without its `(os error N)`
/// (both come from wasi-libc's `strerror`).
fn strerror(e: &std::io::Error) -> String {
    let message = e.to_string();
    match e.raw_os_error() {
        Some(code) => message
            .strip_suffix(&format!(" (os error {code})"))
            .unwrap_or(&message)
            .to_string(),
        None => message,
    }
}

/// The last step: one payout per merchant, then the export.
fn finish(
    term: &Term,
    run: &RunInfo,
    totals: &BTreeMap<String, u64>,
    count: usize,
) -> Result<StepOutcome, JobError> {
    let period = &run.period;
    let mut created = 0;
    for (merchant, total) in totals {
        let key = format!("payout/{period}/{merchant}");
        let value = format!("{total} token={} attempt={}", term.token(), run.attempt);
        // As in Python, every refusal but a lost term fails the step (`unavailable` too).
        if store::create(&key, value.as_bytes())
            .lost_leadership_or_else(|e| JobError::Failed(format!("recording {key}: {e:?}")))?
        {
            created += 1;
        }
    }
    let mut lines = vec![format!(
        "settlement {period}: {count} payments, {} merchants",
        totals.len()
    )];
    lines.extend(
        totals
            .iter()
            .map(|(merchant, total)| format!("{merchant} {total}")),
    );
    let sum: u128 = totals.values().map(|&total| u128::from(total)).sum();
    lines.push(format!("total {sum}"));
    let key = format!("export/{period}");
    store::write(&key, (lines.join("\n") + "\n").as_bytes())
        .lost_leadership_or_else(|e| JobError::Failed(format!("writing {key}: {e:?}")))?;
    log::write(
        log::Level::Info,
        &format!("settlement {period}: {created} payouts recorded"),
    );
    Ok(StepOutcome::Done)
}

leasehold_guest::export!(Settlement);
