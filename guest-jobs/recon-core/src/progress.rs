//! Resumable state: how far through the bank statement we are, which ledger entries are
//! used, and the running totals — serialised compactly between steps.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::amount::format_cents;
use crate::hash::{FNV_OFFSET, fnv1a64};
use crate::parse::Entry;

/// Counts and sums of a reconciliation. Amounts are in cents.
///
/// While the bank statement is being processed, [`Progress::totals`] holds the bank-side
/// fields; the ledger-side fields (`ledger_lines`, `ledger_total_cents`, `missing_in_bank`,
/// `net_difference_cents`) are filled in by [`Progress::final_totals`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub bank_lines: u64,
    pub ledger_lines: u64,
    /// `matched_by_reference + matched_by_amount_date`.
    pub matched: u64,
    pub matched_by_reference: u64,
    pub matched_by_amount_date: u64,
    pub amount_mismatches: u64,
    pub missing_in_ledger: u64,
    pub missing_in_bank: u64,
    pub bank_total_cents: i64,
    pub ledger_total_cents: i64,
    /// Sum of the amounts of matched pairs (mismatched pairs are not included).
    pub matched_total_cents: i64,
    /// `bank_total_cents - ledger_total_cents`.
    pub net_difference_cents: i64,
}

impl Totals {
    /// A short plain-text summary, amounts printed as `1234.56`.
    pub fn render_text(&self, date: &str) -> String {
        let mut out = String::new();
        let mut line = |label: &str, value: String| {
            out.push_str(&format!("{label:<32}{value:>20}\n"));
        };
        line("Reconciliation for", date.to_string());
        line("Bank lines", self.bank_lines.to_string());
        line("Ledger lines", self.ledger_lines.to_string());
        line("Matched", self.matched.to_string());
        line("  by reference", self.matched_by_reference.to_string());
        line(
            "  by amount and date",
            self.matched_by_amount_date.to_string(),
        );
        line("Amount mismatches", self.amount_mismatches.to_string());
        line("Missing in ledger", self.missing_in_ledger.to_string());
        line("Missing in bank", self.missing_in_bank.to_string());
        line("Bank total", format_cents(self.bank_total_cents));
        line("Ledger total", format_cents(self.ledger_total_cents));
        line("Matched total", format_cents(self.matched_total_cents));
        line(
            "Net difference (bank - ledger)",
            format_cents(self.net_difference_cents),
        );
        out
    }

    /// The fields in their fixed order in the state bytes (format version 1).
    fn to_words(&self) -> [u64; 12] {
        [
            self.bank_lines,
            self.ledger_lines,
            self.matched,
            self.matched_by_reference,
            self.matched_by_amount_date,
            self.amount_mismatches,
            self.missing_in_ledger,
            self.missing_in_bank,
            self.bank_total_cents as u64,
            self.ledger_total_cents as u64,
            self.matched_total_cents as u64,
            self.net_difference_cents as u64,
        ]
    }

    fn from_words(w: [u64; 12]) -> Self {
        Totals {
            bank_lines: w[0],
            ledger_lines: w[1],
            matched: w[2],
            matched_by_reference: w[3],
            matched_by_amount_date: w[4],
            amount_mismatches: w[5],
            missing_in_ledger: w[6],
            missing_in_bank: w[7],
            bank_total_cents: w[8] as i64,
            ledger_total_cents: w[9] as i64,
            matched_total_cents: w[10] as i64,
            net_difference_cents: w[11] as i64,
        }
    }
}

/// One bit per ledger entry: set once the entry has been used by a match or a mismatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bitmap {
    words: Vec<u64>,
    len: usize,
}

impl Bitmap {
    fn new(len: usize) -> Self {
        Bitmap {
            words: vec![0; len.div_ceil(64)],
            len,
        }
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> bool {
        let i = index as usize;
        self.words[i / 64] >> (i % 64) & 1 == 1
    }

    #[inline]
    pub(crate) fn set(&mut self, index: u32) {
        let i = index as usize;
        assert!(i < self.len, "ledger index {i} out of range");
        self.words[i / 64] |= 1 << (i % 64);
    }

    fn count_ones(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    fn byte_len(&self) -> usize {
        self.len.div_ceil(8)
    }

    fn write_bytes(&self, out: &mut Vec<u8>) {
        let bytes = self.byte_len();
        for (i, word) in self.words.iter().enumerate() {
            let le = word.to_le_bytes();
            let take = (bytes - i * 8).min(8);
            out.extend_from_slice(&le[..take]);
        }
    }

    fn read_bytes(len: usize, bytes: &[u8]) -> Result<Self, StateError> {
        let mut map = Bitmap::new(len);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut le = [0u8; 8];
            le[..chunk.len()].copy_from_slice(chunk);
            map.words[i] = u64::from_le_bytes(le);
        }
        if !len.is_multiple_of(64)
            && let Some(last) = map.words.last()
            && last >> (len % 64) != 0
        {
            return Err(StateError::Corrupt(
                "bits set beyond the end of the ledger".to_string(),
            ));
        }
        Ok(map)
    }
}

/// Why state bytes were refused, or why a state does not fit the inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateError {
    /// No bytes at all.
    Empty,
    /// The first byte names a format this build does not know.
    UnknownVersion(u8),
    /// Fewer bytes than the header and bitmap need.
    Truncated { expected: usize, actual: usize },
    /// More bytes than the header and bitmap need.
    TrailingBytes { expected: usize, actual: usize },
    /// The checksum at the end does not match the content.
    ChecksumMismatch,
    /// Structurally invalid content.
    Corrupt(String),
    /// The state belongs to different inputs (see [`Progress::check`]).
    WrongInputs(String),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Empty => write!(f, "reconciliation state is empty"),
            StateError::UnknownVersion(v) => write!(
                f,
                "reconciliation state has unknown format version {v} (this build reads version {})",
                Progress::FORMAT_VERSION
            ),
            StateError::Truncated { expected, actual } => write!(
                f,
                "reconciliation state is truncated: {actual} bytes, expected {expected}"
            ),
            StateError::TrailingBytes { expected, actual } => write!(
                f,
                "reconciliation state has trailing bytes: {actual} bytes, expected {expected}"
            ),
            StateError::ChecksumMismatch => write!(f, "reconciliation state checksum mismatch"),
            StateError::Corrupt(why) => write!(f, "reconciliation state is corrupt: {why}"),
            StateError::WrongInputs(why) => {
                write!(f, "reconciliation state does not fit the inputs: {why}")
            }
        }
    }
}

impl std::error::Error for StateError {}

/// Everything a later step needs to continue: the next bank line to process, which ledger
/// entries are used (a bitmap), the running totals, and an optional fingerprint of the
/// inputs chosen by the caller (see [`crate::input_fingerprint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Index of the next bank line to process.
    pub next_bank: usize,
    /// Caller-chosen fingerprint of the inputs; 0 unless set. Stored in the state bytes so
    /// that a resumed step can refuse state that was made from other files.
    pub fingerprint: u64,
    /// Running totals (bank side; see [`Totals`]).
    pub totals: Totals,
    pub(crate) used: Bitmap,
}

/// Fixed part of the state bytes: version, next_bank, ledger_len, fingerprint, 12 totals.
const HEADER_LEN: usize = 1 + 8 + 8 + 8 + 12 * 8;
const CHECKSUM_LEN: usize = 8;

impl Progress {
    /// Format version written as the first byte of [`Progress::to_bytes`].
    pub const FORMAT_VERSION: u8 = 1;

    /// A fresh state for a ledger of `ledger_len` entries.
    pub fn new(ledger_len: usize) -> Self {
        Progress {
            next_bank: 0,
            fingerprint: 0,
            totals: Totals::default(),
            used: Bitmap::new(ledger_len),
        }
    }

    /// Number of ledger entries this state was made for.
    pub fn ledger_len(&self) -> usize {
        self.used.len
    }

    /// True once every bank line has been processed.
    pub fn bank_done(&self, bank_len: usize) -> bool {
        self.next_bank >= bank_len
    }

    /// Whether ledger entry `index` has been used by a match or a mismatch.
    pub fn is_used(&self, index: usize) -> bool {
        index < self.used.len && self.used.get(index as u32)
    }

    /// Number of used ledger entries.
    pub fn used_count(&self) -> usize {
        self.used.count_ones()
    }

    /// Checks that this state can continue on a bank statement of `bank_len` lines and a
    /// ledger of `ledger_len` entries (call it after [`Progress::from_bytes`];
    /// [`crate::reconcile_chunk`] panics on a state that fails it).
    pub fn check(&self, bank_len: usize, ledger_len: usize) -> Result<(), StateError> {
        if self.used.len != ledger_len {
            return Err(StateError::WrongInputs(format!(
                "state is for {} ledger entries, the ledger has {ledger_len}",
                self.used.len
            )));
        }
        if self.next_bank > bank_len {
            return Err(StateError::WrongInputs(format!(
                "state is at bank line {}, the statement has {bank_len} lines",
                self.next_bank
            )));
        }
        Ok(())
    }

    /// The complete totals: the running bank-side totals plus the ledger-side fields
    /// (ledger lines and total, missing in bank = unused ledger entries, net difference).
    /// Meaningful once [`Progress::bank_done`] is true.
    pub fn final_totals(&self, ledger: &[Entry]) -> Totals {
        let mut totals = self.totals.clone();
        totals.ledger_lines = ledger.len() as u64;
        totals.ledger_total_cents = ledger
            .iter()
            .fold(0i64, |sum, e| sum.saturating_add(e.amount_cents));
        totals.missing_in_bank = (ledger.len() - self.used_count().min(ledger.len())) as u64;
        totals.net_difference_cents = totals
            .bank_total_cents
            .saturating_sub(totals.ledger_total_cents);
        totals
    }

    /// Compact, versioned encoding (little-endian):
    ///
    /// | bytes | content |
    /// |---|---|
    /// | 1 | format version (1) |
    /// | 8 | `next_bank` |
    /// | 8 | ledger length *n* |
    /// | 8 | `fingerprint` |
    /// | 96 | the 12 [`Totals`] fields in declaration order |
    /// | ⌈n/8⌉ | used-ledger bitmap: bit *i* mod 8 of byte ⌊*i*/8⌋ is set once ledger entry *i* is used |
    /// | 8 | FNV-1a 64 checksum of everything before it |
    ///
    /// 1,000,000 ledger entries take 125,129 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.used.byte_len() + CHECKSUM_LEN);
        out.push(Self::FORMAT_VERSION);
        out.extend_from_slice(&(self.next_bank as u64).to_le_bytes());
        out.extend_from_slice(&(self.used.len as u64).to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        for word in self.totals.to_words() {
            out.extend_from_slice(&word.to_le_bytes());
        }
        self.used.write_bytes(&mut out);
        let checksum = fnv1a64(FNV_OFFSET, &out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Decodes [`Progress::to_bytes`]; refuses unknown versions, truncated or over-long
    /// input, a bad checksum and bits set past the ledger's end.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StateError> {
        let Some(&version) = bytes.first() else {
            return Err(StateError::Empty);
        };
        if version != Self::FORMAT_VERSION {
            return Err(StateError::UnknownVersion(version));
        }
        if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
            return Err(StateError::Truncated {
                expected: HEADER_LEN + CHECKSUM_LEN,
                actual: bytes.len(),
            });
        }
        let word = |i: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&bytes[1 + 8 * i..9 + 8 * i]);
            u64::from_le_bytes(le)
        };
        let next_bank = word(0);
        let ledger_len = word(1);
        let fingerprint = word(2);
        let expected = usize::try_from(ledger_len)
            .ok()
            .and_then(|n| n.div_ceil(8).checked_add(HEADER_LEN + CHECKSUM_LEN))
            .ok_or_else(|| StateError::Corrupt(format!("ledger length {ledger_len} too large")))?;
        if bytes.len() < expected {
            return Err(StateError::Truncated {
                expected,
                actual: bytes.len(),
            });
        }
        if bytes.len() > expected {
            return Err(StateError::TrailingBytes {
                expected,
                actual: bytes.len(),
            });
        }
        let (body, checksum) = bytes.split_at(expected - CHECKSUM_LEN);
        if fnv1a64(FNV_OFFSET, body).to_le_bytes() != checksum {
            return Err(StateError::ChecksumMismatch);
        }
        let next_bank = usize::try_from(next_bank)
            .map_err(|_| StateError::Corrupt(format!("next bank line {next_bank} too large")))?;
        let mut totals = [0u64; 12];
        for (i, t) in totals.iter_mut().enumerate() {
            *t = word(3 + i);
        }
        let used = Bitmap::read_bytes(ledger_len as usize, &body[HEADER_LEN..])?;
        Ok(Progress {
            next_bank,
            fingerprint,
            totals: Totals::from_words(totals),
            used,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_progress(ledger_len: usize) -> Progress {
        let mut p = Progress::new(ledger_len);
        p.next_bank = 7;
        p.fingerprint = 0xDEAD_BEEF;
        p.totals.bank_lines = 7;
        p.totals.bank_total_cents = -12_345;
        p.totals.matched = 3;
        for i in (0..ledger_len).step_by(3) {
            p.used.set(i as u32);
        }
        p
    }

    #[test]
    fn round_trips_for_many_lengths() {
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 1000] {
            let p = sample_progress(len);
            let bytes = p.to_bytes();
            assert_eq!(bytes.len(), HEADER_LEN + len.div_ceil(8) + CHECKSUM_LEN);
            assert_eq!(bytes[0], 1);
            let back = Progress::from_bytes(&bytes).unwrap();
            assert_eq!(back, p, "len {len}");
            assert_eq!(back.used_count(), len.div_ceil(3));
        }
    }

    #[test]
    fn compact_for_a_million_rows() {
        let bytes = Progress::new(1_000_000).to_bytes();
        assert_eq!(bytes.len(), 125_129);
    }

    #[test]
    fn rejects_bad_input_clearly() {
        let bytes = sample_progress(100).to_bytes();
        assert_eq!(Progress::from_bytes(&[]), Err(StateError::Empty));

        let mut wrong_version = bytes.clone();
        wrong_version[0] = 2;
        let err = Progress::from_bytes(&wrong_version).unwrap_err();
        assert_eq!(err, StateError::UnknownVersion(2));
        assert!(err.to_string().contains("unknown format version 2"));

        for cut in [1, 10, HEADER_LEN, bytes.len() - 1] {
            let err = Progress::from_bytes(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(err, StateError::Truncated { .. }),
                "cut at {cut}: {err}"
            );
            assert!(err.to_string().contains("truncated"));
        }

        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            Progress::from_bytes(&longer),
            Err(StateError::TrailingBytes { .. })
        ));

        let mut flipped = bytes.clone();
        flipped[HEADER_LEN + 3] ^= 0x10;
        assert_eq!(
            Progress::from_bytes(&flipped),
            Err(StateError::ChecksumMismatch)
        );
    }

    #[test]
    fn rejects_bits_past_the_end() {
        let mut p = Progress::new(10);
        p.used.words[0] = 1 << 12;
        let err = Progress::from_bytes(&p.to_bytes()).unwrap_err();
        assert!(matches!(err, StateError::Corrupt(_)), "{err}");
    }

    #[test]
    fn huge_claimed_length_is_refused_without_allocating() {
        let mut bytes = Progress::new(0).to_bytes();
        bytes[9..17].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Progress::from_bytes(&bytes).is_err());
    }

    #[test]
    fn check_compares_with_inputs() {
        let p = sample_progress(10);
        assert!(p.check(7, 10).is_ok());
        assert!(p.check(100, 10).is_ok());
        assert!(matches!(p.check(6, 10), Err(StateError::WrongInputs(_))));
        assert!(matches!(p.check(7, 11), Err(StateError::WrongInputs(_))));
    }

    #[test]
    fn render_text_prints_amounts_as_decimals() {
        let totals = Totals {
            bank_total_cents: 741_669,
            net_difference_cents: -127_000,
            ..Totals::default()
        };
        let text = totals.render_text("2026-11-27");
        assert!(text.contains("2026-11-27"));
        assert!(text.contains("7416.69"));
        assert!(text.contains("-1270.00"));
    }
}
