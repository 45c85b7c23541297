//! Deterministic synthetic data with totals known by construction.

use crate::amount::format_cents;
use crate::date::{format_date, parse_date};
use crate::hash::FastSet;
use crate::progress::Totals;

/// Statement date used by [`generate`].
pub const DEFAULT_GENERATED_DATE: &str = "2026-11-27";

/// A generated pair of input files and the totals [`crate::reconcile`] must produce for
/// them with any tolerance of at least 2 days.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generated {
    pub bank_csv: String,
    pub ledger_csv: String,
    pub expected: Totals,
}

/// splitmix64: a tiny, well-mixed, seedable PRNG (no OS randomness).
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough integer in `0..n` (`n > 0`; the modulo bias is negligible here).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const COUNTERPARTIES: [&str; 12] = [
    "ACME LTD",
    "GLOBEX CORP",
    "INITECH LLC",
    "UMBRELLA CORP",
    "STARK INDUSTRIES",
    "WAYNE ENTERPRISES",
    "Smith, Jones & Partners",
    "HOOLI INC",
    "Bob's \"Quick\" Couriers",
    "SOYLENT FOODS",
    "Tyrell Corp, Leeds branch",
    "Cyberdyne Systems",
];
const BANK_FEES: [&str; 4] = [
    "Account maintenance fee",
    "Outgoing wire fee",
    "Card processing charges",
    "Overdraft interest",
];
const INVOICE_PREFIXES: [&str; 4] = ["INV", "PO", "SO", "CN"];

struct Line {
    date: i32,
    amount: i64,
    reference: String,
    description: String,
}

/// [`generate_on`] with the statement date [`DEFAULT_GENERATED_DATE`].
pub fn generate(rows: usize, seed: u64) -> Generated {
    let date = parse_date(DEFAULT_GENERATED_DATE).expect("valid default date");
    generate_on(rows, seed, date)
}

/// Generates `rows` transactions for the statement dated `statement_date` (a day number).
///
/// Each transaction becomes a bank line, a ledger entry or both. The mix, drawn from a
/// splitmix64 stream seeded with `seed`: ~90 % reference matches, ~3 % amount-and-date
/// matches (bank without reference against a ledger entry without or with one, or a bank
/// reference unknown to the ledger against a ledger entry without one; dates up to 2
/// days apart), ~2 % amount mismatches, ~2.5 % missing in ledger, ~2.5 % missing in bank;
/// ~8 % of the amounts are negative (fees, direct debits). Bank dates lie up to 2 days
/// before the statement date, ledger dates up to 5 days before and never after it. Both
/// files are shuffled, then sorted by date.
///
/// No accidental matches, by construction:
/// - every reference embeds the transaction number, so references never repeat, and a
///   bank line with a reference that the ledger has always finds its own partner;
/// - amounts come from two disjoint pools. Reference matches and mismatches use amounts
///   ending in an even cent digit (realistic, repeats allowed: their references decide).
///   The lines that rule 2 sees or could take — amount-and-date pairs, missing in ledger,
///   missing in bank — use amounts ending in an odd cent digit, each magnitude used by one
///   transaction only. So a bank line reaching rule 2 finds no ledger entry with its amount
///   other than its own partner.
pub fn generate_on(rows: usize, seed: u64, statement_date: i32) -> Generated {
    let mut rng = SplitMix64::new(seed);
    let mut bank: Vec<Line> = Vec::with_capacity(rows);
    let mut ledger: Vec<Line> = Vec::with_capacity(rows);
    let mut t = Totals::default();
    let mut unique = UniqueAmounts::new(rows);

    for i in 0..rows {
        let outgoing = rng.below(100) < 8;
        let sign = if outgoing { -1 } else { 1 };
        let number = 100_000 + i as u64;
        let party = *rng.pick(&COUNTERPARTIES);
        let invoice = format!("{}-{number}", rng.pick(&INVOICE_PREFIXES));
        let bank_date = statement_date - [0, 0, 0, 0, 0, 0, 0, 1, 1, 2][rng.below(10) as usize];
        let (bank_text, ledger_text) = if outgoing {
            (
                format!("{} {invoice}", rng.pick(&BANK_FEES)),
                format!("Bank charges {invoice}"),
            )
        } else {
            (
                format!("{party} payment {invoice}"),
                format!("{party} - invoice {invoice}"),
            )
        };

        let mut push_bank = |line: Line, t: &mut Totals| {
            t.bank_lines += 1;
            t.bank_total_cents += line.amount;
            bank.push(line);
        };
        let mut push_ledger = |line: Line, t: &mut Totals| {
            t.ledger_lines += 1;
            t.ledger_total_cents += line.amount;
            ledger.push(line);
        };

        let category = rng.below(1000);
        if category < 900 {
            // Same reference and amount; dates may be days apart (rule 1 ignores dates).
            let amount = sign * everyday_amount(&mut rng);
            let ledger_date = bank_date - rng.below(4) as i32;
            push_bank(line(bank_date, amount, &invoice, bank_text), &mut t);
            push_ledger(line(ledger_date, amount, &invoice, ledger_text), &mut t);
            t.matched += 1;
            t.matched_by_reference += 1;
            t.matched_total_cents += amount;
        } else if category < 930 {
            let amount = sign * unique.draw(&mut rng);
            // Up to 2 days either way, but never after the statement date.
            let latest = (statement_date - bank_date).min(2);
            let ledger_date = bank_date - 2 + rng.below((latest + 3) as u64) as i32;
            let (bank_ref, ledger_ref) = match rng.below(3) {
                0 => (String::new(), String::new()),
                1 => (String::new(), format!("JRN-{number}")),
                _ => (format!("TRF-{number}"), String::new()),
            };
            let bank_text = if bank_ref.is_empty() {
                format!("{party} transfer")
            } else {
                format!("{party} transfer {bank_ref}")
            };
            push_bank(line(bank_date, amount, &bank_ref, bank_text), &mut t);
            push_ledger(line(ledger_date, amount, &ledger_ref, ledger_text), &mut t);
            t.matched += 1;
            t.matched_by_amount_date += 1;
            t.matched_total_cents += amount;
        } else if category < 950 {
            let amount = sign * everyday_amount(&mut rng);
            let mut ledger_amount = amount;
            while ledger_amount == amount {
                ledger_amount = sign * everyday_amount(&mut rng);
            }
            let ledger_date = bank_date - rng.below(4) as i32;
            push_bank(line(bank_date, amount, &invoice, bank_text), &mut t);
            push_ledger(
                line(ledger_date, ledger_amount, &invoice, ledger_text),
                &mut t,
            );
            t.amount_mismatches += 1;
        } else if category < 975 {
            let amount = sign * unique.draw(&mut rng);
            let reference = if rng.below(2) == 0 {
                format!("TRF-{number}")
            } else {
                String::new()
            };
            let kind = if outgoing {
                "Direct debit"
            } else {
                "Incoming transfer"
            };
            let text = format!("{kind} {party} {reference}").trim_end().to_string();
            push_bank(line(bank_date, amount, &reference, text), &mut t);
            t.missing_in_ledger += 1;
        } else {
            let amount = sign * unique.draw(&mut rng);
            let reference = if rng.below(2) == 0 {
                invoice
            } else {
                String::new()
            };
            let ledger_date = statement_date - rng.below(4) as i32;
            push_ledger(line(ledger_date, amount, &reference, ledger_text), &mut t);
            t.missing_in_bank += 1;
        }
    }
    t.net_difference_cents = t.bank_total_cents - t.ledger_total_cents;

    Generated {
        bank_csv: write_csv(&mut rng, bank, "BNK"),
        ledger_csv: write_csv(&mut rng, ledger, "LED"),
        expected: t,
    }
}

/// A realistic positive amount in cents whose last digit is even: often round sums
/// (25.00, 1250.00), otherwise anything from 1.00 to 20,000.00.
fn everyday_amount(rng: &mut SplitMix64) -> i64 {
    let cents = match rng.below(10) {
        0..=2 => (1 + rng.below(400) as i64) * 500, // 5.00 .. 2000.00 in steps of 5.00
        3..=6 => 100 + rng.below(100_000) as i64,   // 1.00 .. 1000.99
        _ => 100 + rng.below(2_000_000) as i64,     // 1.00 .. 20000.99
    };
    cents - cents % 2
}

/// Positive amounts ending in an odd cent digit, each handed out at most once.
struct UniqueAmounts {
    used: FastSet<i64>,
    /// Draws are `2k + 1` cents for `k` in `50..limit`.
    limit: u64,
}

impl UniqueAmounts {
    fn new(rows: usize) -> Self {
        // About 8 % of the rows draw from this pool; keep it at least 10x larger.
        UniqueAmounts {
            used: FastSet::default(),
            limit: (rows as u64).max(500_000),
        }
    }

    fn draw(&mut self, rng: &mut SplitMix64) -> i64 {
        loop {
            let cents = 2 * (50 + rng.below(self.limit - 50) as i64) + 1;
            if self.used.insert(cents) {
                return cents;
            }
        }
    }
}

fn line(date: i32, amount: i64, reference: &str, description: String) -> Line {
    Line {
        date,
        amount,
        reference: reference.to_string(),
        description,
    }
}

fn write_csv(rng: &mut SplitMix64, mut lines: Vec<Line>, id_prefix: &str) -> String {
    for i in (1..lines.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        lines.swap(i, j);
    }
    lines.sort_by_key(|l| l.date);
    let mut writer = csv::Writer::from_writer(Vec::with_capacity(lines.len() * 80));
    let write = |w: &mut csv::Writer<Vec<u8>>, record: [&str; 5]| {
        w.write_record(record).expect("writing to memory");
    };
    write(&mut writer, crate::parse::HEADER);
    for (n, l) in lines.iter().enumerate() {
        let id = format!("{id_prefix}-{:07}", n + 1);
        let date = format_date(l.date);
        let amount = format_cents(l.amount);
        write(
            &mut writer,
            [&id, &date, &amount, &l.reference, &l.description],
        );
    }
    let bytes = writer.into_inner().expect("writing to memory");
    String::from_utf8(bytes).expect("CSV of UTF-8 strings is UTF-8")
}
