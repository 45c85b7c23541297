//! Daily bank reconciliation, as a Leasehold job.
//!
//! Each period (a day, `YYYY-MM-DD`) reconciles `/data/<period>/bank.csv` (the bank's
//! statement) against `/data/<period>/ledger.csv` (our ledger) with the rules of
//! [`recon_core`]. The day's statement lines are reconciled in chunks of a bounded number of
//! lines, each written as one part of the report. A step parses the day once and reconciles
//! chunk after chunk until the day is done (then it also writes the report) or it has run for
//! its budget ([`STEP_BUDGET`], or the milliseconds in `/data/step-budget`; `0` is one chunk per
//! step, then a step of its own for the report). The state between steps is
//! [`recon_core::Progress`] (which lines are done, which ledger entries are used, running
//! totals), which the host saves as a fenced checkpoint. So a run interrupted by a failover
//! resumes on another replica where its last step ended, and the report is the same byte for
//! byte whatever the budget: its parts are the chunks, numbered in bank order.
//!
//! Written through fenced writes (all idempotent: a re-executed step writes the same values):
//! - `report/<period>/part-<step>`: JSON of the matches and exceptions of that step's lines;
//! - `report/<period>/missing-in-bank`: JSON list of ledger entries the bank never showed;
//! - `report/<period>`: JSON summary: totals, number of parts, tolerance;
//! - `report/<period>/text`: the human-readable report (totals and every exception, up to
//!   [`LISTED`] per category).
//!
//! **Into the accounting database.** When the host grants the job a database named
//! `accounting` (sidecar `[sql.databases] accounting = "…"`), the last step also writes the
//! day's totals and text report into its `reconciliation_reports` table (`reports.sql` beside
//! this crate), one row per period upserted in a transaction the database fences with the term's
//! token, which the row records. Without the grant nothing is written there.
//!
//! **Fanned out.** When `/data/fan-out` holds a number `N` (at least 1), the run hands the
//! matching to every replica instead (it is a `fan-out-job`): step 0 submits `N` tasks and
//! awaits them; task `i` parses the day, splits it into `N` independent parts
//! ([`recon_core::partition`]: lines that can never compete for a ledger entry), matches part
//! `i` and writes what the report needs of its lines ([`recon_core::report_part`]): for each
//! report part it has lines in, their items as JSON (`fan/<period>/part-<i>/chunk-<k>`), and
//! its unused ledger entries (`fan/<period>/part-<i>/missing`); it returns its share of the
//! totals. Step 1 puts those together in bank order ([`recon_core::merge_chunk`] and the
//! rest) without parsing the day, and writes exactly what the sequential run writes (the same
//! parts, report and summary, byte for byte); step 2 deletes the `fan/` keys.

use std::time::Duration;

use leasehold_guest::fan_out::{Guest, Task};
use leasehold_guest::log::{Level, write as log};
use leasehold_guest::prelude::*;
use leasehold_guest::sql::{self, SqlError, Value};
use leasehold_guest::{store, tasks};
use recon_core::{
    Chunk, DEFAULT_TOLERANCE_DAYS, Entry, EntryRef, Fingerprint, Listing, Matcher, PartSummary,
    Progress, Totals, format_cents, input_fingerprint, merge_chunk, merge_missing, missing_in_bank,
    partition, read_entries, reconcile_chunk, report_part, sum_totals,
};
use serde::{Deserialize, Serialize};

/// Exceptions listed per category in the text report.
const LISTED: usize = 50;
/// How long a step goes on reconciling chunks (parsing included) without `/data/step-budget`:
/// a day of a million lines is one step on a 2-core machine (BENCHMARKS.md).
const STEP_BUDGET: Duration = Duration::from_secs(20);
/// Steps a run aims for; each step handles `bank lines / STEPS` lines (at least `MIN_CHUNK`).
const STEPS: usize = 16;
const MIN_CHUNK: usize = 4;
const MAX_CHUNK: usize = 20_000;

struct Reconciliation;

/// What a fanned-out run's task works on, and what its steps carry between them.
#[derive(Serialize, Deserialize)]
struct Fanned {
    /// This part (a task's payload), or none (the run's state).
    part: Option<u32>,
    /// How many parts.
    parts: u32,
    /// The inputs the run started with.
    fingerprint: u64,
    /// The report is written: the next step deletes the tasks' fragments.
    #[serde(default)]
    assembled: bool,
}

/// What a task returns: what it wrote, and its share of the totals.
#[derive(Serialize, Deserialize)]
struct PartMade {
    fingerprint: u64,
    /// Physical lines read of each file (every task reads the whole day).
    lines: (u64, u64),
    summary: PartSummary,
}

fn fragment_key(period: &str, part: u32, chunk: u32) -> String {
    format!("fan/{period}/part-{part}/chunk-{chunk}")
}

fn missing_key(period: &str, part: u32) -> String {
    format!("fan/{period}/part-{part}/missing")
}

/// Bytes per `write-many` call: under the host's 64 MiB a batch.
const BATCH_BYTES: usize = 32 << 20;

/// How long a step may go on reconciling chunks: `/data/step-budget` (milliseconds), else
/// [`STEP_BUDGET`].
fn step_budget() -> Result<Duration, JobError> {
    match std::fs::read_to_string("/data/step-budget") {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| {
                JobError::Failed(format!(
                    "/data/step-budget must hold milliseconds, not {:?}",
                    text.trim()
                ))
            }),
        Err(_) => Ok(STEP_BUDGET),
    }
}

/// The number of parts `/data/fan-out` asks for, if it asks.
fn fan_out() -> Result<Option<u32>, JobError> {
    match std::fs::read_to_string("/data/fan-out") {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(JobError::Failed(format!(
                "/data/fan-out must hold a number of parts of at least 1, not {:?}",
                text.trim()
            ))),
        },
        Err(_) => Ok(None),
    }
}

/// Both files of a period, parsed.
struct Day {
    bank: Vec<Entry>,
    ledger: Vec<Entry>,
    /// Physical lines read of `bank.csv` and of `ledger.csv` (header and blank lines included).
    lines: (u64, u64),
    fingerprint: u64,
}

/// Both files of `period`, parsed (a file that is not well-formed CSV fails the step, naming
/// the file and the line), and their fingerprint.
fn inputs(period: &str) -> Result<Day, JobError> {
    // One text at a time, each dropped once parsed: the texts are a third of the peak memory.
    let parse = |file: &str, fingerprint: Fingerprint| {
        let text = read_input(period, file)?;
        let parsed = read_entries(&text, file).map_err(|e| JobError::Failed(e.to_string()))?;
        Ok::<_, JobError>((parsed, fingerprint.file(&text)))
    };
    // Both files must be there before either is parsed: a day whose ledger has not arrived is
    // not ready, whatever its statement holds.
    for file in ["bank.csv", "ledger.csv"] {
        if std::fs::metadata(format!("/data/{period}/{file}")).is_err() {
            read_input(period, file)?;
        }
    }
    let (bank, fingerprint) = parse("bank.csv", Fingerprint::new())?;
    let (ledger, fingerprint) = parse("ledger.csv", fingerprint)?;
    let fingerprint = fingerprint.finish(DEFAULT_TOLERANCE_DAYS);
    Ok(Day {
        lines: (bank.lines, ledger.lines),
        bank: bank.entries,
        ledger: ledger.entries,
        fingerprint,
    })
}

/// Statement lines per part of the report (and per step of a sequential run).
fn chunk_lines(bank_lines: usize) -> usize {
    (bank_lines / STEPS).clamp(MIN_CHUNK, MAX_CHUNK)
}

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

/// The text report: the totals, the lines read, and the first exceptions of each kind.
fn text_report(
    period: &str,
    totals: &Totals,
    (bank_lines, ledger_lines): (u64, u64),
    listing: &Listing,
) -> String {
    let mut out = totals.render_text(period);
    // Every line of each file, header and blank lines included, so a reader can check them
    // against the files (`wc -l`, plus one if the last line has no line end).
    out.push_str(&format!("{:<32}{bank_lines:>20}\n", "bank.csv lines read"));
    out.push_str(&format!(
        "{:<32}{ledger_lines:>20}\n",
        "ledger.csv lines read"
    ));
    let mismatches: Vec<String> = listing
        .mismatches
        .iter()
        .map(|m| {
            format!(
                "  bank {} / ledger {}: bank {} ledger {} (difference {})",
                m.bank_id,
                m.ledger_id,
                format_cents(m.bank_amount_cents),
                format_cents(m.ledger_amount_cents),
                format_cents(m.difference_cents)
            )
        })
        .collect();
    let entry = |e: &EntryRef| {
        format!(
            "  {} {} {} {} {}",
            e.id,
            e.date,
            format_cents(e.amount_cents),
            e.reference,
            e.description
        )
    };
    let missing_ledger: Vec<String> = listing.missing_in_ledger.iter().map(entry).collect();
    let missing_bank: Vec<String> = listing.missing_in_bank.iter().map(entry).collect();
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
    section(
        &mut out,
        "Missing in bank",
        &missing_bank,
        totals.missing_in_bank,
    );
    out
}

impl Guest for Reconciliation {
    fn describe() -> JobSpec {
        spec("reconciliation")
            .schedule("0 30 2 * * *")
            .time_zone("Europe/London")
            .max_memory_bytes(512 << 20)
            .max_step_time(Duration::from_secs(120))
            .max_write_bytes(16 << 20)
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
        step: u32,
        state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        term.ensure_leader()?;
        let period = run.period.as_str();
        // A fanned-out run: chosen at its first step, carried in its state after.
        let fanned = match &state {
            None => fan_out()?.map(|parts| Fanned {
                part: None,
                parts,
                fingerprint: 0,
                assembled: false,
            }),
            Some(bytes) => serde_json::from_slice::<Fanned>(bytes).ok(),
        };
        if let Some(f) = fanned {
            return fanned_step(term, period, step, f);
        }
        let started = std::time::Instant::now();
        let budget = step_budget()?;
        let Day {
            bank,
            ledger,
            lines,
            fingerprint,
        } = inputs(period)?;
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
        term.ensure_leader()?;

        // Chunk after chunk, each a part of the report numbered by its place in the bank
        // file, until the day is done or the budget is spent (with a budget of 0, one chunk
        // and the report in a step of its own, as before budgets).
        let per_chunk = chunk_lines(bank.len());
        let mut matcher = None;
        // This step's parts as the text report reads them (their exceptions; the matches are
        // only in the stored parts): earlier steps' parts are read back from the store.
        let mut in_step = std::collections::BTreeMap::new();
        while !progress.bank_done(bank.len()) {
            let matcher =
                matcher.get_or_insert_with(|| Matcher::new(&ledger, DEFAULT_TOLERANCE_DAYS));
            let mut chunk = reconcile_chunk(&bank, &ledger, matcher, &mut progress, per_chunk);
            let part = chunk.start / per_chunk;
            put_json(&format!("report/{period}/part-{part}"), &chunk)?;
            log(
                Level::Info,
                &format!(
                    "{period}: statement lines {}..{} of {} reconciled",
                    chunk.start,
                    chunk.end,
                    bank.len()
                ),
            );
            chunk.matched = Vec::new();
            in_step.insert(part as u32, chunk);
            term.ensure_leader()?;
            if budget.is_zero() || (!progress.bank_done(bank.len()) && started.elapsed() >= budget)
            {
                return Ok(StepOutcome::Continue(progress.to_bytes()));
            }
        }
        let parts = bank.len().div_ceil(per_chunk) as u32;
        drop(bank);
        // The text report's first exceptions, from the parts in bank order (read back only as
        // far as it needs).
        let mut listing = Listing::new(LISTED);
        for n in 0..parts {
            let full =
                listing.mismatches.len() == LISTED && listing.missing_in_ledger.len() == LISTED;
            if full {
                break;
            }
            let chunk = match in_step.remove(&n) {
                Some(chunk) => chunk,
                None => get_chunk(&format!("report/{period}/part-{n}"))?,
            };
            listing.take(&chunk);
        }
        let totals = progress.final_totals(&ledger);
        let missing = missing_in_bank(&ledger, &progress);
        listing.take_missing_in_bank(&missing);
        let missing = serde_json::to_vec(&missing).map_err(|e| JobError::Failed(e.to_string()))?;
        finish(term, period, parts, &totals, lines, &listing, &missing)?;
        Ok(StepOutcome::Done)
    }

    fn run_task(term: &Term, run: RunInfo, task: Task) -> Result<Vec<u8>, JobError> {
        let f: Fanned = serde_json::from_slice(&task.payload)
            .map_err(|e| JobError::Failed(format!("task {} is not a part: {e}", task.id)))?;
        let part = f
            .part
            .ok_or_else(|| JobError::Failed(format!("task {} names no part", task.id)))?;
        let period = run.period.as_str();
        let Day {
            bank,
            ledger,
            lines,
            fingerprint,
        } = inputs(period)?;
        if fingerprint != f.fingerprint {
            return Err(JobError::Failed(format!(
                "the input files for {period} changed after the run started; a run never mixes inputs"
            )));
        }
        term.ensure_leader()?;
        let bank_len = bank.len();
        let parts = partition(&bank, &ledger, f.parts);
        let made = report_part(
            bank,
            ledger,
            &parts,
            part,
            chunk_lines(bank_len),
            DEFAULT_TOLERANCE_DAYS,
        );
        term.ensure_leader()?;
        // The fragments, in batches of whole values (each at most a report part's size, so
        // within the write limit whenever the sequential run's parts are).
        let mut batch: Vec<store::Entry> = Vec::new();
        let mut bytes = 0;
        let values = made
            .chunks
            .into_iter()
            .map(|(k, v)| (fragment_key(period, part, k), v))
            .chain(made.missing.map(|v| (missing_key(period, part), v)));
        for (key, value) in values {
            if bytes + value.len() > BATCH_BYTES && !batch.is_empty() {
                put_many(&std::mem::take(&mut batch))?;
                bytes = 0;
            }
            bytes += value.len();
            batch.push(store::Entry { key, value });
        }
        if !batch.is_empty() {
            put_many(&batch)?;
        }
        let t = &made.summary.totals;
        log(
            Level::Info,
            &format!(
                "{period}: part {part} of {}: {} statement lines, {} matched, {} fragments written",
                f.parts,
                t.bank_lines,
                t.matched,
                made.summary.chunks.len() + usize::from(made.summary.missing)
            ),
        );
        serde_json::to_vec(&PartMade {
            fingerprint,
            lines,
            summary: made.summary,
        })
        .map_err(|e| JobError::Failed(e.to_string()))
    }
}

/// A fenced `write-many`; errors end the step as for [`put`].
fn put_many(entries: &[store::Entry]) -> Result<(), JobError> {
    store::write_many(entries).map_err(|e| match e.error {
        store::WriteError::TooLarge(max) => JobError::Failed(format!(
            "{} is larger than the write limit of {max} bytes",
            e.index
                .and_then(|i| entries.get(i as usize))
                .map_or("the batch", |e| e.key.as_str())
        )),
        other => JobError::from(other),
    })
}

/// What every task of a fanned-out run returned.
fn parts_made(f: &Fanned) -> Result<Vec<PartMade>, JobError> {
    (0..f.parts)
        .map(|i| {
            let bytes = tasks::output(&format!("part-{i}"))?
                .ok_or_else(|| JobError::Failed(format!("part {i} has no result")))?;
            let made: PartMade = serde_json::from_slice(&bytes)
                .map_err(|e| JobError::Failed(format!("part {i}'s result is unreadable: {e}")))?;
            if made.fingerprint != f.fingerprint || made.summary.part != i {
                return Err(JobError::Failed(format!(
                    "part {i}'s result was made from other inputs or for another part"
                )));
            }
            Ok(made)
        })
        .collect()
}

/// A fragment a task wrote.
fn get_fragment(key: &str) -> Result<Vec<u8>, JobError> {
    match store::read(key) {
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(JobError::Failed(format!("{key} is missing"))),
        Err(store::ReadError::Unavailable(why)) => {
            Err(JobError::NotReady(format!("store unavailable: {why}")))
        }
        Err(store::ReadError::InvalidKey(why)) => Err(JobError::Failed(why)),
    }
}

/// A fanned-out run's steps: 0 submits one task per part and awaits them; 1 puts what they
/// wrote together and finishes exactly as the sequential run's last steps do; 2 deletes what
/// they wrote.
fn fanned_step(
    term: &Term,
    period: &str,
    step: u32,
    mut f: Fanned,
) -> Result<StepOutcome, JobError> {
    if step == 0 {
        // The leader only notes which inputs the run is for: the tasks parse them.
        let bank_csv = read_input(period, "bank.csv")?;
        let ledger_csv = read_input(period, "ledger.csv")?;
        let fingerprint = input_fingerprint(&bank_csv, &ledger_csv, DEFAULT_TOLERANCE_DAYS);
        f.fingerprint = fingerprint;
        let work: Vec<Task> = (0..f.parts)
            .map(|i| Task {
                id: format!("part-{i}"),
                payload: serde_json::to_vec(&Fanned {
                    part: Some(i),
                    parts: f.parts,
                    fingerprint,
                    assembled: false,
                })
                .expect("a part serializes"),
            })
            .collect();
        tasks::submit(&work)?;
        log(
            Level::Info,
            &format!("{period}: the day fanned out in {} parts", f.parts),
        );
        let state = serde_json::to_vec(&f).map_err(|e| JobError::Failed(e.to_string()))?;
        return Ok(StepOutcome::AwaitTasks(state));
    }
    let made = parts_made(&f)?;
    if f.assembled {
        // The report is written: the tasks' fragments go (deleting again is harmless).
        for m in &made {
            let s = &m.summary;
            for &k in &s.chunks {
                store::delete(&fragment_key(period, s.part, k))?;
            }
            if s.missing {
                store::delete(&missing_key(period, s.part))?;
            }
        }
        return Ok(StepOutcome::Done);
    }
    let bad =
        |e: recon_core::PartsError| JobError::Failed(format!("the parts do not make the day: {e}"));
    let summaries: Vec<PartSummary> = made.iter().map(|m| m.summary.clone()).collect();
    let totals = sum_totals(&summaries).map_err(bad)?;
    let lines = made[0].lines;
    if made.iter().any(|m| m.lines != lines) {
        return Err(JobError::Failed(
            "the parts read files of different lengths".into(),
        ));
    }
    let (bank_len, per_chunk) = (summaries[0].bank_len, summaries[0].chunk_lines.max(1));
    let count = bank_len.div_ceil(per_chunk) as u32;
    if summaries
        .iter()
        .any(|s| s.chunks.iter().any(|&k| k >= count))
    {
        return Err(bad(recon_core::PartsError(format!(
            "a part wrote a fragment beyond the day's {count} parts"
        ))));
    }
    term.ensure_leader()?;
    // Each part of the report from the fragments of the parts that have lines in it.
    let mut listing = Listing::new(LISTED);
    for k in 0..count {
        let fragments = summaries
            .iter()
            .filter(|s| s.chunks.binary_search(&k).is_ok())
            .map(|s| get_fragment(&fragment_key(period, s.part, k)))
            .collect::<Result<Vec<_>, _>>()?;
        let start = u64::from(k) * per_chunk;
        let end = (start + per_chunk).min(bank_len);
        let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
        let part = merge_chunk(start as usize, end as usize, &refs, &mut listing).map_err(bad)?;
        put(&format!("report/{period}/part-{k}"), &part)?;
    }
    let fragments = summaries
        .iter()
        .filter(|s| s.missing)
        .map(|s| get_fragment(&missing_key(period, s.part)))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&[u8]> = fragments.iter().map(Vec::as_slice).collect();
    let (missing, n) = merge_missing(&refs, summaries[0].ledger_len, &mut listing).map_err(bad)?;
    if n != totals.missing_in_bank {
        return Err(bad(recon_core::PartsError(format!(
            "the parts list {n} unused entries and count {}",
            totals.missing_in_bank
        ))));
    }
    finish(term, period, count, &totals, lines, &listing, &missing)?;
    f.assembled = true;
    let state = serde_json::to_vec(&f).map_err(|e| JobError::Failed(e.to_string()))?;
    Ok(StepOutcome::Continue(state))
}

/// The last writes of a run, after its `count` parts: what the bank never showed (`missing`,
/// JSON), the text report, the accounting database's row, and the summary.
fn finish(
    term: &Term,
    period: &str,
    count: u32,
    totals: &Totals,
    lines: (u64, u64),
    listing: &Listing,
    missing: &[u8],
) -> Result<(), JobError> {
    put(&format!("report/{period}/missing-in-bank"), missing)?;
    let text = text_report(period, totals, lines, listing);
    put(&format!("report/{period}/text"), text.as_bytes())?;
    report_to_database(term, period, totals, &text)?;
    put_json(
        &format!("report/{period}"),
        &Summary {
            period,
            tolerance_days: DEFAULT_TOLERANCE_DAYS,
            parts: count,
            totals,
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
    Ok(())
}

/// The database the report is written into, when the host grants it.
const ACCOUNTING: &str = "accounting";

/// Upserts the day's row of `reconciliation_reports` in the `accounting` database, or does
/// nothing when none is granted. A re-executed last step writes the same row again (under its
/// own token).
fn report_to_database(
    term: &Term,
    period: &str,
    totals: &Totals,
    text: &str,
) -> Result<(), JobError> {
    let int = |n: u64| Value::Int(n as i64);
    let params = [
        Value::Text(period.to_string()),
        int(totals.matched),
        int(totals.amount_mismatches),
        int(totals.missing_in_ledger),
        int(totals.missing_in_bank),
        Value::Int(totals.net_difference_cents),
        Value::Text(text.to_string()),
        int(term.token()),
    ];
    match sql::execute(
        ACCOUNTING,
        "INSERT INTO reconciliation_reports (period, matched, amount_mismatches, \
         missing_in_ledger, missing_in_bank, net_difference_cents, report, token) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (period) DO UPDATE SET \
         matched = EXCLUDED.matched, amount_mismatches = EXCLUDED.amount_mismatches, \
         missing_in_ledger = EXCLUDED.missing_in_ledger, missing_in_bank = EXCLUDED.missing_in_bank, \
         net_difference_cents = EXCLUDED.net_difference_cents, report = EXCLUDED.report, \
         token = EXCLUDED.token",
        &params,
    ) {
        Ok(_) | Err(SqlError::NotGranted(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

leasehold_guest::export_fan_out!(Reconciliation);
