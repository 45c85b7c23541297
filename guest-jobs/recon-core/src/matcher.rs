//! The matching rules, applied to the bank statement a chunk at a time.

use serde::{Deserialize, Serialize};

use crate::date::format_date;
use crate::hash::FastMap;
use crate::parse::Entry;
use crate::progress::{Bitmap, Progress};

const NONE: u32 = u32::MAX;

/// How a pair was matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatchKind {
    /// Rule 1: same reference, same amount.
    Reference,
    /// Rule 2: same amount, dates within the tolerance.
    AmountDate,
}

/// A bank line and a ledger entry that agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matched {
    pub bank_id: String,
    pub ledger_id: String,
    pub kind: MatchKind,
    pub amount_cents: i64,
    /// Ledger date minus bank date, in days.
    pub days_apart: i32,
}

/// A bank line and a ledger entry with the same reference but different amounts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub bank_id: String,
    pub ledger_id: String,
    pub reference: String,
    pub bank_amount_cents: i64,
    pub ledger_amount_cents: i64,
    /// `bank_amount_cents - ledger_amount_cents`.
    pub difference_cents: i64,
}

/// An unmatched line, as it appears in its file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRef {
    pub id: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    pub amount_cents: i64,
    pub reference: String,
    pub description: String,
}

/// A bank line with no ledger counterpart.
pub type BankRef = EntryRef;
/// A ledger entry with no bank counterpart.
pub type LedgerRef = EntryRef;

impl From<&Entry> for EntryRef {
    fn from(e: &Entry) -> Self {
        EntryRef {
            id: e.id.clone(),
            date: format_date(e.date),
            amount_cents: e.amount_cents,
            reference: e.reference.clone(),
            description: e.description.clone(),
        }
    }
}

/// The results for bank lines `start..end` (indexes into the bank statement).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub start: usize,
    pub end: usize,
    pub matched: Vec<Matched>,
    pub mismatches: Vec<Mismatch>,
    pub missing_in_ledger: Vec<BankRef>,
}

impl Chunk {
    /// True when the chunk covered no bank line.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// Ledger indexes grouped by key, in file order, in one flat array; each group has a cursor
/// before which every entry is known to be used.
struct Groups {
    bounds: Vec<u32>,
    items: Vec<u32>,
    cursor: Vec<u32>,
}

impl Groups {
    /// `group_of[i]` is the group of ledger entry `i`, or `NONE`.
    fn build(group_of: &[u32], group_count: usize) -> Self {
        let mut bounds = vec![0u32; group_count + 1];
        for &g in group_of {
            if g != NONE {
                bounds[g as usize + 1] += 1;
            }
        }
        for g in 0..group_count {
            bounds[g + 1] += bounds[g];
        }
        let mut fill = bounds[..group_count].to_vec();
        let mut items = vec![0u32; bounds[group_count] as usize];
        for (i, &g) in group_of.iter().enumerate() {
            if g != NONE {
                let slot = &mut fill[g as usize];
                items[*slot as usize] = i as u32;
                *slot += 1;
            }
        }
        Groups::from_parts(bounds, items)
    }

    /// Groups from their bounds (`bounds[g]..bounds[g + 1]` indexes `items`).
    fn from_parts(bounds: Vec<u32>, items: Vec<u32>) -> Self {
        let cursor = bounds[..bounds.len() - 1].to_vec();
        Groups {
            bounds,
            items,
            cursor,
        }
    }

    /// First unused entry of group `g` in ledger file order.
    fn first_unused(&mut self, g: u32, used: &Bitmap) -> Option<u32> {
        let g = g as usize;
        let end = self.bounds[g + 1];
        let mut c = self.cursor[g];
        while c < end && used.get(self.items[c as usize]) {
            c += 1;
        }
        self.cursor[g] = c;
        (c < end).then(|| self.items[c as usize])
    }

    fn reset(&mut self) {
        let n = self.cursor.len();
        self.cursor.copy_from_slice(&self.bounds[..n]);
    }
}

fn min_index(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Indexes over the ledger, built once per step: by reference, and by amount then date.
///
/// A `Matcher` also caches, per group, how far the used entries reach, so it must only be
/// used with one run (one bank statement, one ledger, one [`Progress`] carried forward).
/// Using it with a `Progress` at another position resets that cache, so a fresh
/// `Progress` is always safe.
pub struct Matcher<'a> {
    ledger_len: usize,
    tolerance_days: i32,
    /// Reference → group in `ref_groups`.
    by_reference: FastMap<&'a str, u32>,
    ref_groups: Groups,
    /// Amount → range of `slot_dates`; slots are distinct (amount, date) pairs sorted by
    /// amount then date. Slot `s` owns groups `2s` (ledger entries without reference) and
    /// `2s + 1` (with reference) in `date_groups`.
    by_amount: FastMap<i64, (u32, u32)>,
    slot_dates: Vec<i32>,
    date_groups: Groups,
    /// `next_bank` of the `Progress` the cursors are valid for.
    synced_at: Option<usize>,
}

impl<'a> Matcher<'a> {
    /// Builds the indexes in O(n log n). A negative tolerance is treated as 0.
    pub fn new(ledger: &'a [Entry], tolerance_days: i32) -> Self {
        assert!(ledger.len() < NONE as usize, "ledger too large");

        let mut by_reference: FastMap<&'a str, u32> =
            FastMap::with_capacity_and_hasher(ledger.len(), Default::default());
        let mut ref_group_of = vec![NONE; ledger.len()];
        for (i, e) in ledger.iter().enumerate() {
            if !e.reference.is_empty() {
                let next = by_reference.len() as u32;
                ref_group_of[i] = *by_reference.entry(e.reference.as_str()).or_insert(next);
            }
        }
        let ref_groups = Groups::build(&ref_group_of, by_reference.len());
        drop(ref_group_of);

        // Sorted by (amount, date, file position): each run of equal (amount, date) is a
        // slot, whose entries without and with a reference form its two groups, each in
        // file order.
        let mut order: Vec<(i64, i32, u32)> = ledger
            .iter()
            .enumerate()
            .map(|(i, e)| (e.amount_cents, e.date, i as u32))
            .collect();
        order.sort_unstable();
        let mut by_amount: FastMap<i64, (u32, u32)> = FastMap::default();
        let mut slot_dates: Vec<i32> = Vec::new();
        let mut bounds: Vec<u32> = vec![0];
        let mut items: Vec<u32> = Vec::with_capacity(ledger.len());
        let mut run = 0;
        while run < order.len() {
            let (amount, date, _) = order[run];
            let mut end = run + 1;
            while end < order.len() && order[end].0 == amount && order[end].1 == date {
                end += 1;
            }
            for with_reference in [false, true] {
                for &(_, _, i) in &order[run..end] {
                    if ledger[i as usize].reference.is_empty() != with_reference {
                        items.push(i);
                    }
                }
                bounds.push(items.len() as u32);
            }
            let slot = slot_dates.len() as u32;
            slot_dates.push(date);
            by_amount
                .entry(amount)
                .and_modify(|range| range.1 = slot + 1)
                .or_insert((slot, slot + 1));
            run = end;
        }
        drop(order);
        let date_groups = Groups::from_parts(bounds, items);

        Matcher {
            ledger_len: ledger.len(),
            tolerance_days: tolerance_days.max(0),
            by_reference,
            ref_groups,
            by_amount,
            slot_dates,
            date_groups,
            synced_at: None,
        }
    }

    /// The tolerance in use (never negative).
    pub fn tolerance_days(&self) -> i32 {
        self.tolerance_days
    }

    /// Resets the cursors unless they were last advanced for exactly this position.
    fn sync(&mut self, next_bank: usize) {
        if self.synced_at.is_some_and(|at| at != next_bank) {
            self.ref_groups.reset();
            self.date_groups.reset();
        }
        self.synced_at = Some(next_bank);
    }

    /// Rule 1: first unused ledger entry with this (non-empty) reference.
    fn find_by_reference(&mut self, reference: &str, used: &Bitmap) -> Option<u32> {
        let &g = self.by_reference.get(reference)?;
        self.ref_groups.first_unused(g, used)
    }

    /// Rule 2: unused entry with this amount and the nearest date within the tolerance,
    /// ties by file order. Entries with a reference qualify only for a bank line without.
    fn find_by_amount_date(&mut self, bank: &Entry, used: &Bitmap) -> Option<u32> {
        let &(lo, hi) = self.by_amount.get(&bank.amount_cents)?;
        let (lo, hi) = (lo as usize, hi as usize);
        let bank_has_ref = !bank.reference.is_empty();
        let d = i64::from(bank.date);
        let tolerance = i64::from(self.tolerance_days);
        let p = lo + self.slot_dates[lo..hi].partition_point(|&x| i64::from(x) < d);
        // Walk outwards from the bank date: `left` are earlier dates, `right` later ones.
        let mut left = p; // exclusive
        let mut right = p;
        loop {
            let dl = (left > lo).then(|| d - i64::from(self.slot_dates[left - 1]));
            let dr = (right < hi).then(|| i64::from(self.slot_dates[right]) - d);
            let distance = match (dl, dr) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => return None,
            };
            if distance > tolerance {
                return None;
            }
            let mut best = None;
            if dl == Some(distance) {
                left -= 1;
                best = min_index(best, self.candidate(left, bank_has_ref, used));
            }
            if dr == Some(distance) {
                best = min_index(best, self.candidate(right, bank_has_ref, used));
                right += 1;
            }
            if best.is_some() {
                return best;
            }
        }
    }

    fn candidate(&mut self, slot: usize, bank_has_ref: bool, used: &Bitmap) -> Option<u32> {
        let slot = slot as u32;
        let without_ref = self.date_groups.first_unused(slot * 2, used);
        if bank_has_ref {
            return without_ref;
        }
        min_index(
            without_ref,
            self.date_groups.first_unused(slot * 2 + 1, used),
        )
    }
}

/// Processes up to `max_lines` bank lines from `progress.next_bank`, marks the ledger
/// entries they use, updates the running totals, and returns what it found. `max_lines ==
/// 0` processes nothing.
///
/// # Panics
/// When `matcher` or `progress` were made for a ledger of another length, or
/// `progress.next_bank > bank.len()` (check resumed state with [`Progress::check`]).
pub fn reconcile_chunk(
    bank: &[Entry],
    ledger: &[Entry],
    matcher: &mut Matcher<'_>,
    progress: &mut Progress,
    max_lines: usize,
) -> Chunk {
    assert_eq!(
        matcher.ledger_len,
        ledger.len(),
        "matcher built for another ledger"
    );
    if let Err(e) = progress.check(bank.len(), ledger.len()) {
        panic!("{e}");
    }
    matcher.sync(progress.next_bank);

    let start = progress.next_bank;
    let end = start.saturating_add(max_lines).min(bank.len());
    let mut chunk = Chunk {
        start,
        end,
        ..Chunk::default()
    };
    for b in &bank[start..end] {
        let outcome = matcher.decide(b, ledger, &progress.used);
        if let Some(i) = outcome.ledger() {
            progress.used.set(i);
        }
        record(b, ledger, outcome, &mut progress.totals, &mut chunk);
    }
    progress.next_bank = end;
    matcher.synced_at = Some(end);
    chunk
}

/// What the rules decided for one bank line; the ledger entry it used, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Rule 1 with equal amounts.
    Reference(u32),
    /// Rule 1 with different amounts: an amount mismatch.
    Mismatch(u32),
    /// Rule 2.
    AmountDate(u32),
    /// Missing in ledger.
    Missing,
}

impl Outcome {
    /// The ledger entry the bank line used, if any.
    pub fn ledger(self) -> Option<u32> {
        match self {
            Outcome::Reference(i) | Outcome::Mismatch(i) | Outcome::AmountDate(i) => Some(i),
            Outcome::Missing => None,
        }
    }
}

impl Matcher<'_> {
    /// The rules for bank line `b`, given the ledger entries already `used`.
    pub(crate) fn decide(&mut self, b: &Entry, ledger: &[Entry], used: &Bitmap) -> Outcome {
        if !b.reference.is_empty()
            && let Some(i) = self.find_by_reference(&b.reference, used)
        {
            return if ledger[i as usize].amount_cents == b.amount_cents {
                Outcome::Reference(i)
            } else {
                Outcome::Mismatch(i)
            };
        }
        match self.find_by_amount_date(b, used) {
            Some(i) => Outcome::AmountDate(i),
            None => Outcome::Missing,
        }
    }
}

/// One bank line's item in the report, in the list its outcome puts it in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// In `matched`.
    Matched(Matched),
    /// In `mismatches`.
    Mismatch(Mismatch),
    /// In `missing_in_ledger`.
    MissingInLedger(BankRef),
}

/// What `outcome` says of bank line `b` (the ledger entry it names is `ledger`'s): the totals
/// it adds to, and its item.
pub(crate) fn tally(
    b: &Entry,
    ledger: &[Entry],
    outcome: Outcome,
    totals: &mut crate::progress::Totals,
) -> Item {
    totals.bank_lines += 1;
    totals.bank_total_cents = totals.bank_total_cents.saturating_add(b.amount_cents);
    match outcome {
        Outcome::Reference(i) | Outcome::AmountDate(i) => {
            let l = &ledger[i as usize];
            let kind = if matches!(outcome, Outcome::Reference(_)) {
                totals.matched_by_reference += 1;
                MatchKind::Reference
            } else {
                totals.matched_by_amount_date += 1;
                MatchKind::AmountDate
            };
            totals.matched += 1;
            totals.matched_total_cents = totals.matched_total_cents.saturating_add(b.amount_cents);
            Item::Matched(Matched {
                bank_id: b.id.clone(),
                ledger_id: l.id.clone(),
                kind,
                amount_cents: b.amount_cents,
                days_apart: l.date - b.date,
            })
        }
        Outcome::Mismatch(i) => {
            let l = &ledger[i as usize];
            totals.amount_mismatches += 1;
            Item::Mismatch(Mismatch {
                bank_id: b.id.clone(),
                ledger_id: l.id.clone(),
                reference: b.reference.clone(),
                bank_amount_cents: b.amount_cents,
                ledger_amount_cents: l.amount_cents,
                difference_cents: b.amount_cents.saturating_sub(l.amount_cents),
            })
        }
        Outcome::Missing => {
            totals.missing_in_ledger += 1;
            Item::MissingInLedger(BankRef::from(b))
        }
    }
}

/// Records what `outcome` says of bank line `b` ([`tally`]): the totals it adds to, and its
/// item in `chunk`.
pub(crate) fn record(
    b: &Entry,
    ledger: &[Entry],
    outcome: Outcome,
    totals: &mut crate::progress::Totals,
    chunk: &mut Chunk,
) {
    match tally(b, ledger, outcome, totals) {
        Item::Matched(m) => chunk.matched.push(m),
        Item::Mismatch(m) => chunk.mismatches.push(m),
        Item::MissingInLedger(m) => chunk.missing_in_ledger.push(m),
    }
}

/// Every ledger entry not used by a match or mismatch, in ledger file order. Call it once
/// [`Progress::bank_done`] is true.
pub fn missing_in_bank(ledger: &[Entry], progress: &Progress) -> Vec<LedgerRef> {
    ledger
        .iter()
        .enumerate()
        .filter(|&(i, _)| !progress.is_used(i))
        .map(|(_, e)| LedgerRef::from(e))
        .collect()
}
