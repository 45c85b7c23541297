//! Daily bank reconciliation, as a Leasehold job.
//!
//! Each period (a day, `YYYY-MM-DD`) reconciles `/data/<period>/bank.csv` (the bank's
//! statement) against `/data/<period>/ledger.csv` (our ledger) with the rules of
//! [`recon_core`]. The run is split into steps of a bounded number of statement lines; the
//! state between steps is [`recon_core::Progress`] (which lines are done, which ledger entries
//! are used, running totals), which the host saves as a fenced checkpoint. So a run interrupted
//! by a failover resumes on another replica where it stopped.
//!
//! Written through fenced writes (all idempotent: a re-executed step writes the same values):
//! - `report/<period>/part-<step>`: JSON of the matches and exceptions of that step's lines;
//! - `report/<period>/missing-in-bank`: JSON list of ledger entries the bank never showed;
//! - `report/<period>`: JSON summary: totals, number of parts, tolerance;
//! - `report/<period>/text`: the human-readable report (totals and every exception, up to
//!   [`LISTED`] per category).

use leasehold_guest::log::{Level, write as log};
use leasehold_guest::prelude::*;
use leasehold_guest::store;
use recon_core::{
    Chunk, DEFAULT_TOLERANCE_DAYS, Entry, Matcher, Progress, Totals, format_cents,
    input_fingerprint, missing_in_bank, parse_entries, reconcile_chunk,
};
use serde::Serialize;

/// Exceptions listed per category in the text report.
const LISTED: usize = 50;
/// Steps a run aims for; each step handles `bank lines / STEPS` lines (at least `MIN_CHUNK`).
const STEPS: usize = 16;
const MIN_CHUNK: usize = 4;
const MAX_CHUNK: usize = 20_000;

struct Reconciliation;

#[derive(Serialize)]
struct Summary<'a> {
    period: &'a str,
    tolerance_days: i32,
    parts: u32,
    totals: &'a Totals,
}

fn read_input(period: &str, file: &str) -> Result<String, JobError> {
    let path = format!("/data/{period}/{file}");
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(JobError::NotReady(format!(
            "{path} not found: the statement for {period} has not arrived"
        ))),
        Err(e) => Err(JobError::Failed(format!("cannot read {path}: {e}"))),
    }
}

/// A fenced write; a refused write or a lost term ends the step with `lost-leadership`.
fn put(key: &str, value: &[u8]) -> Result<(), JobError> {
    let mut tries = 0;
    loop {
        match store::write(key, value) {
            Ok(()) => return Ok(()),
            Err(store::WriteError::Fenced(_) | store::WriteError::NotLeader) => {
                return Err(JobError::LostLeadership);
            }
            Err(store::WriteError::Unavailable(why)) if tries < 3 => {
                tries += 1;
                log(
                    Level::Warn,
                    &format!("write of {key} failed ({why}); retrying"),
                );
            }
            Err(store::WriteError::Unavailable(why)) => {
                return Err(JobError::NotReady(format!("store unavailable: {why}")));
            }
            Err(store::WriteError::InvalidKey(why)) => {
                return Err(JobError::Failed(format!("invalid key {key}: {why}")));
            }
            Err(store::WriteError::TooLarge(max)) => {
                return Err(JobError::Failed(format!(
                    "{key} is {} bytes, more than the limit of {max}",
                    value.len()
                )));
            }
            Err(store::WriteError::QuotaExceeded(u)) => {
                return Err(JobError::Failed(format!(
                    "writing {key} would keep {} keys and {} bytes, past the job's quota of {} keys and {} bytes",
                    u.keys, u.bytes, u.max_keys, u.max_bytes
                )));
            }
        }
    }
}

fn put_json<T: Serialize>(key: &str, value: &T) -> Result<(), JobError> {
    let bytes = serde_json::to_vec(value).map_err(|e| JobError::Failed(e.to_string()))?;
    put(key, &bytes)
}

fn get_chunk(key: &str) -> Result<Chunk, JobError> {
    match store::read(key) {
        Ok(Some(bytes)) => serde_json::from_slice(&bytes)
            .map_err(|e| JobError::Failed(format!("{key} is not a report part: {e}"))),
        Ok(None) => Err(JobError::Failed(format!("{key} is missing"))),
        Err(store::ReadError::Unavailable(why)) => {
            Err(JobError::NotReady(format!("store unavailable: {why}")))
        }
        Err(store::ReadError::InvalidKey(why)) => Err(JobError::Failed(why)),
    }
}

fn text_report(period: &str, totals: &Totals, parts: u32) -> Result<String, JobError> {
    let mut out = totals.render_text(period);
    let mut mismatches = Vec::new();
    let mut missing_ledger = Vec::new();
    for part in 0..parts {
        let chunk = get_chunk(&format!("report/{period}/part-{part}"))?;
        for m in chunk.mismatches {
            if mismatches.len() < LISTED {
                mismatches.push(format!(
                    "  bank {} / ledger {}: bank {} ledger {} (difference {})",
                    m.bank_id,
                    m.ledger_id,
                    format_cents(m.bank_amount_cents),
                    format_cents(m.ledger_amount_cents),
                    format_cents(m.difference_cents)
                ));
            }
        }
        for b in chunk.missing_in_ledger {
            if missing_ledger.len() < LISTED {
                missing_ledger.push(format!(
                    "  {} {} {} {} {}",
                    b.id,
                    b.date,
                    format_cents(b.amount_cents),
                    b.reference,
                    b.description
                ));
            }
        }
    }
    let section = |out: &mut String, title: &str, lines: &[String], total: u64| {
        out.push_str(&format!("\n{title} ({total}):\n"));
        for l in lines {
            out.push_str(l);
            out.push('\n');
        }
        if total as usize > lines.len() {
            out.push_str(&format!(
                "  ... and {} more\n",
                total as usize - lines.len()
            ));
        }
    };
    section(
        &mut out,
        "Amount mismatches",
        &mismatches,
        totals.amount_mismatches,
    );
    section(
        &mut out,
        "Missing in ledger",
        &missing_ledger,
        totals.missing_in_ledger,
    );
    Ok(out)
}

fn missing_in_bank_text(ledger: &[Entry], progress: &Progress, total: u64) -> String {
    let mut out = format!("\nMissing in bank ({total}):\n");
    for l in missing_in_bank(ledger, progress).iter().take(LISTED) {
        out.push_str(&format!(
            "  {} {} {} {} {}\n",
            l.id,
            l.date,
            format_cents(l.amount_cents),
            l.reference,
            l.description
        ));
    }
    if total as usize > LISTED {
        out.push_str(&format!("  ... and {} more\n", total as usize - LISTED));
    }
    out
}

impl Guest for Reconciliation {
    fn describe() -> JobSpec {
        spec("reconciliation")
            .schedule("0 30 2 * * *")
            .time_zone("Europe/London")
            .max_memory_bytes(512 << 20)
            .max_step_millis(120_000)
            .max_write_bytes(16 << 20)
            .build()
    }

    fn run_step(
        term: &Term,
        run: RunInfo,
        step: u32,
        state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        if !term.still_leader() {
            return Err(JobError::LostLeadership);
        }
        let period = run.period.as_str();
        let bank_csv = read_input(period, "bank.csv")?;
        let ledger_csv = read_input(period, "ledger.csv")?;
        let bank =
            parse_entries(&bank_csv, "bank.csv").map_err(|e| JobError::Failed(e.to_string()))?;
        let ledger = parse_entries(&ledger_csv, "ledger.csv")
            .map_err(|e| JobError::Failed(e.to_string()))?;
        let fingerprint = input_fingerprint(&bank_csv, &ledger_csv, DEFAULT_TOLERANCE_DAYS);
        let mut progress = match state {
            None => {
                let mut p = Progress::new(ledger.len());
                p.fingerprint = fingerprint;
                p
            }
            Some(bytes) => {
                let p = Progress::from_bytes(&bytes)
                    .map_err(|e| JobError::Failed(format!("checkpoint unusable: {e}")))?;
                if p.fingerprint != fingerprint {
                    return Err(JobError::Failed(format!(
                        "the input files for {period} changed after the run started; a run never mixes inputs"
                    )));
                }
                p.check(bank.len(), ledger.len()).map_err(|e| {
                    JobError::Failed(format!("checkpoint does not fit the inputs: {e}"))
                })?;
                p
            }
        };
        if !term.still_leader() {
            return Err(JobError::LostLeadership);
        }

        if !progress.bank_done(bank.len()) {
            let chunk_lines = (bank.len() / STEPS).clamp(MIN_CHUNK, MAX_CHUNK);
            let mut matcher = Matcher::new(&ledger, DEFAULT_TOLERANCE_DAYS);
            let chunk = reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, chunk_lines);
            put_json(&format!("report/{period}/part-{step}"), &chunk)?;
            log(
                Level::Info,
                &format!(
                    "{period}: statement lines {}..{} of {} reconciled",
                    chunk.start,
                    chunk.end,
                    bank.len()
                ),
            );
            return Ok(StepOutcome::Continue(progress.to_bytes()));
        }

        // Last step: what the bank never showed, the totals, and the report.
        let totals = progress.final_totals(&ledger);
        let missing = missing_in_bank(&ledger, &progress);
        put_json(&format!("report/{period}/missing-in-bank"), &missing)?;
        let mut text = text_report(period, &totals, step)?;
        text.push_str(&missing_in_bank_text(
            &ledger,
            &progress,
            totals.missing_in_bank,
        ));
        put(&format!("report/{period}/text"), text.as_bytes())?;
        put_json(
            &format!("report/{period}"),
            &Summary {
                period,
                tolerance_days: DEFAULT_TOLERANCE_DAYS,
                parts: step,
                totals: &totals,
            },
        )?;
        log(
            Level::Info,
            &format!(
                "{period}: reconciled, token {}: {} matched, {} mismatches, {} missing in ledger, {} missing in bank, net difference {}",
                term.token(),
                totals.matched,
                totals.amount_mismatches,
                totals.missing_in_ledger,
                totals.missing_in_bank,
                format_cents(totals.net_difference_cents)
            ),
        );
        Ok(StepOutcome::Done)
    }
}

leasehold_guest::export!(Reconciliation);
