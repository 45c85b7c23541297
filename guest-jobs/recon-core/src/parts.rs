//! Reconciling a day in independent parts (fan-out), with exactly the results of one pass,
//! put together without parsing the day again.
//!
//! A bank line can only ever take a ledger entry with its reference (rule 1) or its amount
//! (rule 2), and two bank lines compete only for entries both could take. So the lines and
//! entries joined, directly or through others, by a shared non-empty reference or a shared
//! amount form groups that never touch each other's entries: matching each group alone, its
//! bank lines in file order, decides every line exactly as one pass over the whole day does
//! (the rules only look at which entries of the line's own reference or amount are used).
//!
//! [`partition`] finds the groups (union-find over references and amounts) and deals them
//! into `parts` parts of about equal size, the largest first. [`report_part`] matches one part
//! and renders each of its lines' items as the JSON the sequential run writes for it, in
//! *fragments*: one per report chunk the part has lines in (each item with its bank line), and
//! one of its unused ledger entries (each with its ledger index); its [`PartSummary`] says
//! which fragments it made and adds up its share of the totals.
//!
//! Then, with no entry at hand: [`merge_chunk`] interleaves the parts' fragments of one chunk
//! into exactly the bytes `serde_json` writes for the sequential run's [`Chunk`],
//! [`merge_missing`] the parts' unused entries into exactly the missing-in-bank list, and
//! [`sum_totals`] adds the summaries into exactly the sequential totals. Each refuses parts
//! that do not make the day: a line in no part or in two, a part missing or twice, parts made
//! for another day.
//!
//! **Sums.** The sequential run's sums saturate at the `i64` range, in file order; a sum of
//! parts is the same only when no running sum can reach that bound, which holds whenever the
//! amounts' absolute values add up within it (each summary carries that sum). [`sum_totals`]
//! refuses a day beyond it (over about 92,000 lines at the largest amount) instead of guessing.

use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::hash::FastMap;
use crate::matcher::{BankRef, Chunk, Item, LedgerRef, Matcher, Mismatch, tally};
use crate::parse::Entry;
use crate::progress::{Progress, Totals};

/// The part of every bank line and every ledger entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    /// Part of bank line `i`.
    pub bank: Vec<u32>,
    /// Part of ledger entry `i`.
    pub ledger: Vec<u32>,
    /// How many parts.
    pub count: u32,
}

/// Finds the independent groups of `bank` and `ledger` and deals them into `parts` parts
/// (at least 1), deterministically: the same inputs give the same parts on every replica.
pub fn partition<'a>(bank: &'a [Entry], ledger: &'a [Entry], parts: u32) -> Parts {
    let parts = parts.max(1);
    let n = bank.len() + ledger.len();
    // Nodes: bank lines, then ledger entries, then one per reference and one per amount.
    let mut keys: FastMap<Key<'a>, u32> = FastMap::default();
    let mut parent: Vec<u32> = (0..n as u32).collect();
    for (i, e) in bank.iter().chain(ledger.iter()).enumerate() {
        let mut link = |k: Key<'a>, parent: &mut Vec<u32>| {
            let next = parent.len() as u32;
            let node = *keys.entry(k).or_insert(next);
            if node == next {
                parent.push(next);
            }
            union(parent, i as u32, node);
        };
        link(Key::Amount(e.amount_cents), &mut parent);
        if !e.reference.is_empty() {
            link(Key::Reference(&e.reference), &mut parent);
        }
    }
    // Group sizes (lines only), then groups dealt largest first to the lightest part; ties by
    // the group's first line, so the deal is the same everywhere.
    let mut size: FastMap<u32, (u64, u32)> = FastMap::default();
    for i in 0..n as u32 {
        let root = find(&mut parent, i);
        size.entry(root).or_insert((0, i)).0 += 1;
    }
    let mut groups: Vec<(u64, u32, u32)> = size
        .into_iter()
        .map(|(root, (n, first))| (n, first, root))
        .collect();
    groups.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut load = vec![0u64; parts as usize];
    let mut part_of: FastMap<u32, u32> = FastMap::default();
    for (n, _, root) in groups {
        let lightest = (0..parts as usize)
            .min_by_key(|p| (load[*p], *p))
            .unwrap_or(0);
        load[lightest] += n;
        part_of.insert(root, lightest as u32);
    }
    let mut of = |i: usize| part_of[&find(&mut parent, i as u32)];
    let bank_parts = (0..bank.len()).map(&mut of).collect();
    let ledger_parts = (bank.len()..n).map(&mut of).collect();
    Parts {
        bank: bank_parts,
        ledger: ledger_parts,
        count: parts,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key<'a> {
    Amount(i64),
    Reference(&'a str),
}

fn find(parent: &mut [u32], mut i: u32) -> u32 {
    while parent[i as usize] != i {
        let up = parent[parent[i as usize] as usize];
        parent[i as usize] = up;
        i = up;
    }
    i
}

fn union(parent: &mut [u32], a: u32, b: u32) {
    let (a, b) = (find(parent, a), find(parent, b));
    if a != b {
        let (lo, hi) = (a.min(b), a.max(b));
        parent[hi as usize] = lo;
    }
}

/// Why parts do not make the day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsError(pub String);

impl std::fmt::Display for PartsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PartsError {}

fn refuse<T>(why: String) -> Result<T, PartsError> {
    Err(PartsError(why))
}

/// What a part made, and its share of the totals: a fanned-out task's result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartSummary {
    /// This part's number, from 0.
    pub part: u32,
    /// How many parts the day was dealt into.
    pub parts: u32,
    /// Bank lines of the whole day.
    pub bank_len: u64,
    /// Ledger entries of the whole day.
    pub ledger_len: u64,
    /// Bank lines per report chunk (chunk `k` holds lines `k × chunk_lines` onwards).
    pub chunk_lines: u64,
    /// This part's share: the bank-side fields for its bank lines, the ledger-side fields
    /// (`ledger_lines`, `ledger_total_cents`, `missing_in_bank`) for its ledger entries;
    /// `net_difference_cents` is 0.
    pub totals: Totals,
    /// The sum of its bank lines' absolute amounts (saturating).
    pub bank_abs_cents: u64,
    /// The sum of its ledger entries' absolute amounts (saturating).
    pub ledger_abs_cents: u64,
    /// The chunks it made a fragment for (it has lines in), ascending.
    pub chunks: Vec<u32>,
    /// Whether it made a fragment of unused ledger entries (it has some).
    pub missing: bool,
}

/// One part's fragments and summary, from [`report_part`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartFragments {
    /// What it made, and its share of the totals.
    pub summary: PartSummary,
    /// `(chunk, fragment)` for each chunk in `summary.chunks`, in that order.
    pub chunks: Vec<(u32, Vec<u8>)>,
    /// Its unused ledger entries, when `summary.missing`.
    pub missing: Option<Vec<u8>>,
}

// The kinds of a fragment's records: the list of the report the item belongs to.
const MATCHED: u8 = 0;
const MISMATCH: u8 = 1;
const MISSING_IN_LEDGER: u8 = 2;
const MISSING_IN_BANK: u8 = 3;

/// Appends one record: the line or entry (u32 LE), its kind (u8), the JSON's length (u32 LE),
/// the JSON.
fn push_record<T: Serialize>(out: &mut Vec<u8>, index: u32, kind: u8, item: &T) {
    let at = out.len();
    out.extend_from_slice(&index.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&[0; 4]);
    serde_json::to_writer(&mut *out, item).expect("an item serializes");
    let len = (out.len() - at - 9) as u32;
    out[at + 5..at + 9].copy_from_slice(&len.to_le_bytes());
}

/// One record of a fragment: `(index, kind, JSON)`.
type Record<'a> = (u32, u8, &'a [u8]);

/// The records of a fragment.
fn records(bytes: &[u8]) -> Result<Vec<Record<'_>>, PartsError> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.len() < 9 {
            return refuse(format!(
                "a fragment ends inside a record ({} bytes left)",
                rest.len()
            ));
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let (index, kind, len) = (word(&rest[..4]), rest[4], word(&rest[5..9]) as usize);
        if kind > MISSING_IN_BANK || rest.len() - 9 < len {
            return refuse(format!(
                "a fragment's record for line {index} is not well formed"
            ));
        }
        out.push((index, kind, &rest[9..9 + len]));
        rest = &rest[9 + len..];
    }
    Ok(out)
}

/// Matches part `part` of `parts` alone (its bank lines in file order against its ledger
/// entries, with the rules of the crate doc) and renders what the report needs of it, in chunks
/// of `chunk_lines` bank lines. `bank` and `ledger` are the whole day, moved in (only the
/// part's lines are kept).
pub fn report_part(
    bank: Vec<Entry>,
    ledger: Vec<Entry>,
    parts: &Parts,
    part: u32,
    chunk_lines: usize,
    tolerance_days: i32,
) -> PartFragments {
    let chunk_lines = chunk_lines.max(1);
    let (bank_len, ledger_len) = (bank.len() as u64, ledger.len() as u64);
    let (bank_index, bank): (Vec<u32>, Vec<Entry>) = bank
        .into_iter()
        .enumerate()
        .filter(|(i, _)| parts.bank[*i] == part)
        .map(|(i, e)| (i as u32, e))
        .unzip();
    let (ledger_index, ledger): (Vec<u32>, Vec<Entry>) = ledger
        .into_iter()
        .enumerate()
        .filter(|(i, _)| parts.ledger[*i] == part)
        .map(|(i, e)| (i as u32, e))
        .unzip();
    let mut matcher = Matcher::new(&ledger, tolerance_days);
    let mut progress = Progress::new(ledger.len());
    let mut summary = PartSummary {
        part,
        parts: parts.count,
        bank_len,
        ledger_len,
        chunk_lines: chunk_lines as u64,
        ..PartSummary::default()
    };
    let mut chunks: Vec<(u32, Vec<u8>)> = Vec::new();
    for (b, &line) in bank.iter().zip(&bank_index) {
        let outcome = matcher.decide(b, &ledger, &progress.used);
        if let Some(i) = outcome.ledger() {
            progress.used.set(i);
        }
        summary.bank_abs_cents = summary
            .bank_abs_cents
            .saturating_add(b.amount_cents.unsigned_abs());
        let chunk = (line as usize / chunk_lines) as u32;
        if chunks.last().map(|c| c.0) != Some(chunk) {
            chunks.push((chunk, Vec::new()));
        }
        let Some((_, out)) = chunks.last_mut() else {
            unreachable!("a chunk was just pushed")
        };
        match tally(b, &ledger, outcome, &mut summary.totals) {
            Item::Matched(m) => push_record(out, line, MATCHED, &m),
            Item::Mismatch(m) => push_record(out, line, MISMATCH, &m),
            Item::MissingInLedger(m) => push_record(out, line, MISSING_IN_LEDGER, &m),
        }
    }
    let mut missing = Vec::new();
    for (k, (e, &index)) in ledger.iter().zip(&ledger_index).enumerate() {
        let t = &mut summary.totals;
        t.ledger_lines += 1;
        t.ledger_total_cents = t.ledger_total_cents.saturating_add(e.amount_cents);
        summary.ledger_abs_cents = summary
            .ledger_abs_cents
            .saturating_add(e.amount_cents.unsigned_abs());
        if !progress.is_used(k) {
            summary.totals.missing_in_bank += 1;
            push_record(&mut missing, index, MISSING_IN_BANK, &LedgerRef::from(e));
        }
    }
    summary.chunks = chunks.iter().map(|c| c.0).collect();
    summary.missing = !missing.is_empty();
    PartFragments {
        summary,
        chunks,
        missing: (!missing.is_empty()).then_some(missing),
    }
}

/// The first exceptions of each kind, in report order, as the text report lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// How many of each kind are kept.
    pub limit: usize,
    /// The first amount mismatches, in bank order.
    pub mismatches: Vec<Mismatch>,
    /// The first bank lines missing in the ledger, in bank order.
    pub missing_in_ledger: Vec<BankRef>,
    /// The first ledger entries missing in the bank, in ledger order.
    pub missing_in_bank: Vec<LedgerRef>,
}

impl Listing {
    /// Keeps the first `limit` of each kind.
    pub fn new(limit: usize) -> Self {
        Listing {
            limit,
            ..Listing::default()
        }
    }

    /// Takes what `chunk`'s exceptions add (chunks in bank order).
    pub fn take(&mut self, chunk: &Chunk) {
        let room = self.limit.saturating_sub(self.mismatches.len());
        self.mismatches
            .extend(chunk.mismatches.iter().take(room).cloned());
        let room = self.limit.saturating_sub(self.missing_in_ledger.len());
        self.missing_in_ledger
            .extend(chunk.missing_in_ledger.iter().take(room).cloned());
    }

    /// Takes the entries missing in bank (all of them, in ledger order).
    pub fn take_missing_in_bank(&mut self, missing: &[LedgerRef]) {
        self.missing_in_bank = missing.iter().take(self.limit).cloned().collect();
    }

    fn keep<T: serde::de::DeserializeOwned>(
        limit: usize,
        list: &mut Vec<T>,
        json: &[u8],
    ) -> Result<(), PartsError> {
        if list.len() < limit {
            list.push(
                serde_json::from_slice(json)
                    .map_err(|e| PartsError(format!("a fragment's item is not readable: {e}")))?,
            );
        }
        Ok(())
    }
}

/// The report chunk of bank lines `start..end` from the fragments the parts made of it, as the
/// bytes `serde_json::to_vec` gives the sequential run's [`Chunk`]; its exceptions go to
/// `listing`. Fails unless every line of the chunk is in exactly one fragment.
pub fn merge_chunk(
    start: usize,
    end: usize,
    fragments: &[&[u8]],
    listing: &mut Listing,
) -> Result<Vec<u8>, PartsError> {
    let mut slots: Vec<Option<(u8, &[u8])>> = vec![None; end.saturating_sub(start)];
    let mut bytes = 0;
    for f in fragments {
        for (index, kind, json) in records(f)? {
            let i = index as usize;
            if !(start..end).contains(&i) || kind == MISSING_IN_BANK {
                return refuse(format!(
                    "a fragment of lines {start}..{end} holds an item of line {index} (kind {kind})"
                ));
            }
            if slots[i - start].replace((kind, json)).is_some() {
                return refuse(format!("bank line {index} is in two parts"));
            }
            bytes += json.len() + 1;
        }
    }
    if let Some(n) = slots.iter().position(Option::is_none) {
        return refuse(format!("bank line {} is in no part", start + n));
    }
    let mut out = Vec::with_capacity(bytes + 96);
    write!(out, "{{\"start\":{start},\"end\":{end}").expect("writes to a Vec");
    for (kind, name) in [
        (MATCHED, "matched"),
        (MISMATCH, "mismatches"),
        (MISSING_IN_LEDGER, "missing_in_ledger"),
    ] {
        write!(out, ",\"{name}\":[").expect("writes to a Vec");
        let mut first = true;
        for &(k, json) in slots.iter().flatten() {
            if k != kind {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(json);
            match kind {
                MISMATCH => Listing::keep(listing.limit, &mut listing.mismatches, json)?,
                MISSING_IN_LEDGER => {
                    Listing::keep(listing.limit, &mut listing.missing_in_ledger, json)?
                }
                _ => {}
            }
        }
        out.push(b']');
    }
    out.push(b'}');
    Ok(out)
}

/// The missing-in-bank list of a day of `ledger_len` entries from the parts' fragments of
/// unused entries, as the bytes `serde_json::to_vec` gives the sequential run's list, and how
/// many entries it holds; the first go to `listing`.
pub fn merge_missing(
    fragments: &[&[u8]],
    ledger_len: u64,
    listing: &mut Listing,
) -> Result<(Vec<u8>, u64), PartsError> {
    let mut all = Vec::new();
    for f in fragments {
        for (index, kind, json) in records(f)? {
            if kind != MISSING_IN_BANK || u64::from(index) >= ledger_len {
                return refuse(format!(
                    "a fragment of unused entries holds an item of entry {index} (kind {kind}) of {ledger_len}"
                ));
            }
            all.push((index, json));
        }
    }
    all.sort_unstable_by_key(|r| r.0);
    if let Some(w) = all.windows(2).find(|w| w[0].0 == w[1].0) {
        return refuse(format!("ledger entry {} is in two parts", w[0].0));
    }
    listing.missing_in_bank.clear();
    let mut out = Vec::with_capacity(all.iter().map(|r| r.1.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (n, (_, json)) in all.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(json);
        Listing::keep(listing.limit, &mut listing.missing_in_bank, json)?;
    }
    out.push(b']');
    Ok((out, all.len() as u64))
}

/// The day's totals from every part's summary, exactly as the sequential run's
/// [`Progress::final_totals`]. Fails unless the summaries are parts `0..n` of one day, each
/// once, covering every line; and refuses a day whose amounts could reach the `i64` bound (see
/// the module doc).
pub fn sum_totals(summaries: &[PartSummary]) -> Result<Totals, PartsError> {
    let Some(first) = summaries.first() else {
        return refuse("no part's summary".into());
    };
    let n = first.parts as usize;
    if summaries.len() != n {
        return refuse(format!(
            "{} summaries of a day in {n} parts",
            summaries.len()
        ));
    }
    let mut seen = vec![false; n];
    let (mut bank_abs, mut ledger_abs) = (0u128, 0u128);
    let (mut bank_total, mut ledger_total, mut matched_total) = (0i128, 0i128, 0i128);
    let mut t = Totals::default();
    for s in summaries {
        let same = (s.parts, s.bank_len, s.ledger_len, s.chunk_lines)
            == (
                first.parts,
                first.bank_len,
                first.ledger_len,
                first.chunk_lines,
            );
        if !same {
            return refuse(format!("part {} was made for another day", s.part));
        }
        match seen.get_mut(s.part as usize) {
            Some(seen) if !*seen => *seen = true,
            _ => {
                return refuse(format!(
                    "part {} of {n} is there twice or is no part",
                    s.part
                ));
            }
        }
        let p = &s.totals;
        t.bank_lines += p.bank_lines;
        t.ledger_lines += p.ledger_lines;
        t.matched += p.matched;
        t.matched_by_reference += p.matched_by_reference;
        t.matched_by_amount_date += p.matched_by_amount_date;
        t.amount_mismatches += p.amount_mismatches;
        t.missing_in_ledger += p.missing_in_ledger;
        t.missing_in_bank += p.missing_in_bank;
        bank_total += i128::from(p.bank_total_cents);
        ledger_total += i128::from(p.ledger_total_cents);
        matched_total += i128::from(p.matched_total_cents);
        bank_abs += u128::from(s.bank_abs_cents);
        ledger_abs += u128::from(s.ledger_abs_cents);
    }
    if (t.bank_lines, t.ledger_lines) != (first.bank_len, first.ledger_len) {
        return refuse(format!(
            "the parts hold {} bank lines and {} ledger entries of {} and {}",
            t.bank_lines, t.ledger_lines, first.bank_len, first.ledger_len
        ));
    }
    if t.matched + t.amount_mismatches + t.missing_in_bank != t.ledger_lines {
        return refuse("the parts' used and unused ledger entries do not add up".into());
    }
    let bound = i64::MAX as u128;
    if bank_abs > bound || ledger_abs > bound {
        return refuse(
            "the day's amounts add up past the i64 range, where the totals depend on the order of the sums: reconcile it without fan-out".into(),
        );
    }
    // Within the bound, no running sum saturates in any order: the sums are exact.
    t.bank_total_cents = bank_total as i64;
    t.ledger_total_cents = ledger_total as i64;
    t.matched_total_cents = matched_total as i64;
    t.net_difference_cents = t.bank_total_cents.saturating_sub(t.ledger_total_cents);
    Ok(t)
}
