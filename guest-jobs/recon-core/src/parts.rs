//! Reconciling a day in independent parts (fan-out), with exactly the results of one pass.
//!
//! A bank line can only ever take a ledger entry with its reference (rule 1) or its amount
//! (rule 2), and two bank lines compete only for entries both could take. So the lines and
//! entries joined, directly or through others, by a shared non-empty reference or a shared
//! amount form groups that never touch each other's entries: matching each group alone, its
//! bank lines in file order, decides every line exactly as one pass over the whole day does
//! (the rules only look at which entries of the line's own reference or amount are used).
//!
//! [`partition`] finds the groups (union-find over references and amounts) and deals them
//! into `parts` parts of about equal size, the largest first; [`reconcile_part`] matches one
//! part and returns each of its bank lines' [`Outcome`] ([`PartResult`], 9 bytes a line);
//! [`assemble`] puts every part's results back in bank order as the [`Chunk`]s and
//! [`Progress`] a sequential run would have made with the same chunk size.

use crate::hash::FastMap;
use crate::matcher::{Chunk, Matcher, Outcome, record};
use crate::parse::Entry;
use crate::progress::Progress;

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

/// What one part decided for each of its bank lines: `(bank line, outcome)` in bank order,
/// ledger entries by their index in the whole ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartResult {
    /// The part's bank lines and their outcomes.
    pub lines: Vec<(u32, Outcome)>,
}

/// Why a part's result does not fit the day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsError(pub String);

impl std::fmt::Display for PartsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PartsError {}

impl PartResult {
    /// 9 bytes a line: the bank line (u32 LE), the kind (0 reference, 1 mismatch, 2 amount and
    /// date, 3 missing), the ledger entry (u32 LE; 0 when missing).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.lines.len() * 9);
        for (b, o) in &self.lines {
            let (kind, l) = match *o {
                Outcome::Reference(l) => (0u8, l),
                Outcome::Mismatch(l) => (1, l),
                Outcome::AmountDate(l) => (2, l),
                Outcome::Missing => (3, 0),
            };
            out.extend_from_slice(&b.to_le_bytes());
            out.push(kind);
            out.extend_from_slice(&l.to_le_bytes());
        }
        out
    }

    /// Reads [`PartResult::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PartsError> {
        if !bytes.len().is_multiple_of(9) {
            return Err(PartsError(format!(
                "a part's result of {} bytes is not whole lines of 9 bytes",
                bytes.len()
            )));
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let lines = bytes
            .chunks_exact(9)
            .map(|c| {
                let (b, l) = (word(&c[..4]), word(&c[5..]));
                let o = match c[4] {
                    0 => Outcome::Reference(l),
                    1 => Outcome::Mismatch(l),
                    2 => Outcome::AmountDate(l),
                    3 => Outcome::Missing,
                    k => return Err(PartsError(format!("unknown outcome {k} for bank line {b}"))),
                };
                Ok((b, o))
            })
            .collect::<Result<_, _>>()?;
        Ok(PartResult { lines })
    }
}

/// Matches part `part` of `parts` alone: its bank lines in file order against its ledger
/// entries, with the rules of the crate doc. `bank` and `ledger` are the whole day, moved in
/// (only the part's lines are kept).
pub fn reconcile_part(
    bank: Vec<Entry>,
    ledger: Vec<Entry>,
    parts: &Parts,
    part: u32,
    tolerance_days: i32,
) -> PartResult {
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
    let mut lines = Vec::with_capacity(bank.len());
    for (k, b) in bank.iter().enumerate() {
        let outcome = matcher.decide(b, &ledger, &progress.used);
        if let Some(i) = outcome.ledger() {
            progress.used.set(i);
        }
        let whole = match outcome {
            Outcome::Reference(i) => Outcome::Reference(ledger_index[i as usize]),
            Outcome::Mismatch(i) => Outcome::Mismatch(ledger_index[i as usize]),
            Outcome::AmountDate(i) => Outcome::AmountDate(ledger_index[i as usize]),
            Outcome::Missing => Outcome::Missing,
        };
        lines.push((bank_index[k], whole));
    }
    PartResult { lines }
}

/// Every part's results back in bank order, as the chunks of `chunk_lines` lines and the
/// [`Progress`] a sequential run over the whole day would have produced: the same items in the
/// same order, the same totals and used entries. Fails when the results do not cover every
/// bank line exactly once or name a ledger entry that does not exist.
pub fn assemble(
    bank: &[Entry],
    ledger: &[Entry],
    results: &[PartResult],
    chunk_lines: usize,
) -> Result<(Vec<Chunk>, Progress), PartsError> {
    let mut outcome: Vec<Option<Outcome>> = vec![None; bank.len()];
    for r in results {
        for (b, o) in &r.lines {
            let slot = outcome
                .get_mut(*b as usize)
                .ok_or_else(|| PartsError(format!("bank line {b} does not exist")))?;
            if slot.replace(*o).is_some() {
                return Err(PartsError(format!("bank line {b} is in two parts")));
            }
            if o.ledger().is_some_and(|l| l as usize >= ledger.len()) {
                return Err(PartsError(format!("ledger entry {o:?} does not exist")));
            }
        }
    }
    let mut progress = Progress::new(ledger.len());
    let mut chunks = Vec::new();
    let chunk_lines = chunk_lines.max(1);
    let mut start = 0;
    while start < bank.len() {
        let end = (start + chunk_lines).min(bank.len());
        let mut chunk = Chunk {
            start,
            end,
            ..Chunk::default()
        };
        for i in start..end {
            let o = outcome[i].ok_or_else(|| PartsError(format!("bank line {i} is in no part")))?;
            if let Some(l) = o.ledger() {
                if progress.is_used(l as usize) {
                    return Err(PartsError(format!("ledger entry {l} is used twice")));
                }
                progress.used.set(l);
            }
            record(&bank[i], ledger, o, &mut progress.totals, &mut chunk);
        }
        progress.next_bank = end;
        chunks.push(chunk);
        start = end;
    }
    Ok((chunks, progress))
}
