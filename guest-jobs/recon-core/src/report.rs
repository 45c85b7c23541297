//! The whole reconciliation in one call, and its report.

use serde::{Deserialize, Serialize};

use crate::hash::{FNV_OFFSET, fnv1a64};
use crate::matcher::{
    BankRef, Chunk, LedgerRef, Matched, Matcher, Mismatch, missing_in_bank, reconcile_chunk,
};
use crate::parse::Entry;
use crate::progress::{Progress, Totals};

/// Default date tolerance of rule 2, in days.
pub const DEFAULT_TOLERANCE_DAYS: i32 = 2;

/// The complete result of one day's reconciliation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The period reconciled, `YYYY-MM-DD`.
    pub date: String,
    pub tolerance_days: i32,
    pub totals: Totals,
    /// In bank file order.
    pub matched: Vec<Matched>,
    /// In bank file order.
    pub mismatches: Vec<Mismatch>,
    /// In bank file order.
    pub missing_in_ledger: Vec<BankRef>,
    /// In ledger file order.
    pub missing_in_bank: Vec<LedgerRef>,
}

impl Report {
    /// An empty report to fill with [`Report::push_chunk`].
    pub fn new(date: &str, tolerance_days: i32) -> Self {
        Report {
            date: date.to_string(),
            tolerance_days,
            ..Report::default()
        }
    }

    /// Appends a chunk's items (chunks must be pushed in order).
    pub fn push_chunk(&mut self, chunk: Chunk) {
        self.matched.extend(chunk.matched);
        self.mismatches.extend(chunk.mismatches);
        self.missing_in_ledger.extend(chunk.missing_in_ledger);
    }

    /// The plain-text totals summary ([`Totals::render_text`]).
    pub fn render_text(&self) -> String {
        self.totals.render_text(&self.date)
    }
}

/// Runs every rule over the whole input at once (a negative tolerance counts as 0).
pub fn reconcile(date: &str, bank: &[Entry], ledger: &[Entry], tolerance_days: i32) -> Report {
    let mut matcher = Matcher::new(ledger, tolerance_days);
    let mut progress = Progress::new(ledger.len());
    let mut report = Report::new(date, matcher.tolerance_days());
    report.push_chunk(reconcile_chunk(
        bank,
        ledger,
        &mut matcher,
        &mut progress,
        bank.len(),
    ));
    report.missing_in_bank = missing_in_bank(ledger, &progress);
    report.totals = progress.final_totals(ledger);
    report
}

/// A fingerprint of the inputs (FNV-1a 64 over both texts and the tolerance) to keep in
/// [`Progress::fingerprint`], so a resumed step can tell that the files changed.
pub fn input_fingerprint(bank_csv: &str, ledger_csv: &str, tolerance_days: i32) -> u64 {
    Fingerprint::new()
        .file(bank_csv)
        .file(ledger_csv)
        .finish(tolerance_days)
}

/// [`input_fingerprint`] a file at a time (the bank statement, then the ledger), so a reader
/// can drop each text once it is parsed: `Fingerprint::new().file(bank).file(ledger).finish(t)`
/// equals `input_fingerprint(bank, ledger, t)`.
#[derive(Clone, Copy, Debug)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

impl Fingerprint {
    /// Nothing read yet.
    pub fn new() -> Self {
        Fingerprint(FNV_OFFSET)
    }

    /// The next file's text.
    pub fn file(self, text: &str) -> Self {
        let h = fnv1a64(self.0, &(text.len() as u64).to_le_bytes());
        Fingerprint(fnv1a64(h, text.as_bytes()))
    }

    /// The fingerprint, with the tolerance.
    pub fn finish(self, tolerance_days: i32) -> u64 {
        fnv1a64(self.0, &tolerance_days.to_le_bytes())
    }
}
