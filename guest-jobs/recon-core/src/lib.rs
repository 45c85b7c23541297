//! Matching logic of the daily bank reconciliation job.
//!
//! Pure computation: no threads, clock, randomness or I/O, so the same code runs natively
//! and inside a `wasm32-wasip2` guest.
//!
//! # Inputs
//!
//! `bank.csv` (the bank's statement for the day) and `ledger.csv` (our ledger entries),
//! both with the header `id,date,amount,reference,description`; see [`read_entries`]. They are
//! read strictly ([`strict_csv`]): a file that is not well-formed CSV (an unclosed quote, text
//! after a closing quote, a stray quote, a lone CR, a NUL byte, the header again) is refused
//! naming the file and the line where the problem starts, so no line is ever dropped silently;
//! and every physical line read is counted, for the report.
//! Money is integer cents (`i64`); dates are day numbers (days since 1970-01-01, `i32`).
//!
//! # Matching rules
//!
//! Bank lines are processed in file order; each ledger entry is used at most once. For
//! each bank line:
//!
//! 1. **By reference.** If the bank line's reference is non-empty and an unused ledger
//!    entry has the same reference (exact, case-sensitive; with several, the first unused
//!    in ledger file order), the pair is **matched** (kind `reference`) when the amounts
//!    are equal and an **amount mismatch** otherwise. Dates are not compared. Either way
//!    the ledger entry becomes used.
//! 2. **By amount and date.** Otherwise, among unused ledger entries with exactly the same
//!    amount and a date at most `tolerance_days` (default 2) away, the one with the
//!    smallest date distance, ties broken by ledger file order, is **matched** (kind
//!    `amount-date`). Which ledger entries qualify:
//!    - a bank line **without** a reference may take any ledger entry, with or without a
//!      reference;
//!    - a bank line **with** a reference (that found no unused ledger entry with that
//!      reference in rule 1) may still match this way, but only a ledger entry **without**
//!      a reference: two different non-empty references never match.
//! 3. Otherwise the bank line is **missing in ledger**.
//!
//! After the last bank line, every unused ledger entry is **missing in bank**.
//!
//! # In parts
//!
//! The same results come from matching independent parts of the day separately (a job fanned
//! out to several workers): see [`partition`] and [`report_part`]; and the report is put
//! together from what the parts made without parsing the day again: [`merge_chunk`],
//! [`merge_missing`], [`sum_totals`].
//!
//! Totals ([`Totals`]): line counts of both files, counts of each category (matched, split
//! by kind; amount mismatches; missing in ledger; missing in bank), the bank total, the
//! ledger total, the sum of matched amounts, and the net difference (bank − ledger).
//! Sums saturate at the `i64` range (each amount is at most 999,999,999,999.99).
//!
//! # Running in steps
//!
//! All progress lives in [`Progress`], which serialises to a compact, versioned byte
//! string ([`Progress::to_bytes`]: a bitmap of used ledger entries plus counters, about
//! 125 kB for a million ledger entries). A step parses the files, builds a [`Matcher`]
//! (O(n log n)), restores the `Progress`, calls [`reconcile_chunk`] for a bounded number
//! of bank lines and saves the `Progress` again. Once [`Progress::bank_done`], the last
//! step calls [`missing_in_bank`] and [`Progress::final_totals`]. Any chunking gives the
//! same items, in the same order, and the same totals as one [`reconcile`] call.
//!
//! ```
//! use recon_core::*;
//! let bank = parse_entries("id,date,amount,reference,description\n\
//!     B1,2026-11-27,10.00,INV-1,ACME\n", "bank.csv").unwrap();
//! let ledger = parse_entries("id,date,amount,reference,description\n\
//!     L1,2026-11-26,10,INV-1,ACME invoice\nL2,2026-11-27,5,,petty cash\n", "ledger.csv").unwrap();
//!
//! let mut progress = Progress::new(ledger.len());
//! while !progress.bank_done(bank.len()) {
//!     let bytes = progress.to_bytes(); // ... saved, then restored in the next step:
//!     progress = Progress::from_bytes(&bytes).unwrap();
//!     let mut matcher = Matcher::new(&ledger, DEFAULT_TOLERANCE_DAYS);
//!     let chunk = reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, 1000);
//!     assert_eq!(chunk.matched[0].ledger_id, "L1");
//! }
//! let totals = progress.final_totals(&ledger);
//! assert_eq!(missing_in_bank(&ledger, &progress)[0].id, "L2");
//! assert_eq!(totals.net_difference_cents, -500);
//! assert_eq!(totals, reconcile("2026-11-27", &bank, &ledger, 2).totals);
//! ```

mod amount;
mod date;
mod generate;
mod hash;
mod matcher;
mod parse;
mod parts;
mod progress;
mod report;
pub mod strict_csv;

#[cfg(test)]
mod tests;

pub use amount::{MAX_AMOUNT_CENTS, format_cents, parse_amount};
pub use date::{
    civil_from_days, days_from_civil, days_in_month, format_date, is_leap_year, parse_date,
};
pub use generate::{DEFAULT_GENERATED_DATE, Generated, generate, generate_on};
pub use matcher::{
    BankRef, Chunk, EntryRef, Item, LedgerRef, MatchKind, Matched, Matcher, Mismatch, Outcome,
    missing_in_bank, reconcile_chunk,
};
pub use parse::{Entry, HEADER, ParseError, Parsed, parse_entries, read_entries};
pub use parts::{
    Listing, PartFragments, PartSummary, Parts, PartsError, merge_chunk, merge_missing, partition,
    report_part, sum_totals,
};
pub use progress::{Progress, StateError, Totals};
pub use report::{DEFAULT_TOLERANCE_DAYS, Fingerprint, Report, input_fingerprint, reconcile};
