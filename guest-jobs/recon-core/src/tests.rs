//! Cross-module tests: the hand-checked sample, chunking invariance, a naive reference
//! implementation on collision-heavy random data, and generated data.

use crate::generate::SplitMix64;
use crate::*;

const SAMPLE_BANK: &str = include_str!("../../reconciliation/sample/2026-11-27/bank.csv");
const SAMPLE_LEDGER: &str = include_str!("../../reconciliation/sample/2026-11-27/ledger.csv");

fn sample() -> (Vec<Entry>, Vec<Entry>) {
    (
        parse_entries(SAMPLE_BANK, "bank.csv").unwrap(),
        parse_entries(SAMPLE_LEDGER, "ledger.csv").unwrap(),
    )
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> &str) -> Vec<&str> {
    items.iter().map(id).collect()
}

/// Every number and id list of sample/2026-11-27/EXPECTED.md.
#[test]
fn sample_matches_expected_md() {
    let (bank, ledger) = sample();
    assert_eq!((bank.len(), ledger.len()), (12, 13));
    let report = reconcile("2026-11-27", &bank, &ledger, DEFAULT_TOLERANCE_DAYS);

    let pairs: Vec<(&str, &str, MatchKind, i64, i32)> = report
        .matched
        .iter()
        .map(|m| {
            (
                m.bank_id.as_str(),
                m.ledger_id.as_str(),
                m.kind,
                m.amount_cents,
                m.days_apart,
            )
        })
        .collect();
    use MatchKind::{AmountDate, Reference};
    assert_eq!(
        pairs,
        vec![
            ("BNK-001", "LED-101", Reference, 125_000, 0),
            ("BNK-002", "LED-102", Reference, 84_050, -1),
            ("BNK-003", "LED-103", Reference, -120_000, 0),
            ("BNK-005", "LED-108", AmountDate, -1_250, -1),
            ("BNK-006", "LED-111", AmountDate, 43_000, 1),
            ("BNK-007", "LED-112", AmountDate, 7_550, 0),
            ("BNK-009", "LED-104", Reference, 200_000, 0),
            ("BNK-010", "LED-110", AmountDate, -4_500, 0),
            ("BNK-011", "LED-105", Reference, 9_999, -3),
            ("BNK-012", "LED-107", Reference, 31_820, 0),
        ]
    );
    assert_eq!(
        report.mismatches,
        vec![Mismatch {
            bank_id: "BNK-004".into(),
            ledger_id: "LED-106".into(),
            reference: "INV-1047".into(),
            bank_amount_cents: 310_000,
            ledger_amount_cents: 300_000,
            difference_cents: 10_000,
        }]
    );
    assert_eq!(ids(&report.missing_in_ledger, |e| &e.id), ["BNK-008"]);
    assert_eq!(report.missing_in_ledger[0].amount_cents, 56_000);
    assert_eq!(
        ids(&report.missing_in_bank, |e| &e.id),
        ["LED-109", "LED-113"]
    );
    assert_eq!(
        report
            .missing_in_bank
            .iter()
            .map(|e| e.amount_cents)
            .collect::<Vec<_>>(),
        [43_000, 150_000]
    );
    // The quoted description with a comma survived parsing.
    assert_eq!(bank[8].description, "SMITH, JONES & PARTNERS INV-1051");
    assert_eq!(
        ledger[3].description,
        "Smith, Jones & Partners - consulting, November"
    );

    assert_eq!(
        report.totals,
        Totals {
            bank_lines: 12,
            ledger_lines: 13,
            matched: 10,
            matched_by_reference: 6,
            matched_by_amount_date: 4,
            amount_mismatches: 1,
            missing_in_ledger: 1,
            missing_in_bank: 2,
            bank_total_cents: 741_669,
            ledger_total_cents: 868_669,
            matched_total_cents: 375_669,
            net_difference_cents: -127_000,
        }
    );
    let text = report.render_text();
    for needle in ["2026-11-27", "7416.69", "8686.69", "3756.69", "-1270.00"] {
        assert!(text.contains(needle), "{needle} not in:\n{text}");
    }
}

/// Runs the reconciliation the way the guest does: one step per chunk, state through
/// bytes, items through JSON, and (optionally) a new `Matcher` per step.
fn run_in_steps(
    bank: &[Entry],
    ledger: &[Entry],
    tolerance: i32,
    chunk: usize,
    fresh_matcher: bool,
) -> Report {
    let mut report = Report::new("2026-11-27", tolerance.max(0));
    let mut state = Progress::new(ledger.len()).to_bytes();
    let mut kept = Matcher::new(ledger, tolerance);
    loop {
        let mut progress = Progress::from_bytes(&state).unwrap();
        progress.check(bank.len(), ledger.len()).unwrap();
        if progress.bank_done(bank.len()) {
            report.missing_in_bank = missing_in_bank(ledger, &progress);
            report.totals = progress.final_totals(ledger);
            return report;
        }
        let before = progress.next_bank;
        let result = if fresh_matcher {
            let mut matcher = Matcher::new(ledger, tolerance);
            reconcile_chunk(bank, ledger, &mut matcher, &mut progress, chunk)
        } else {
            reconcile_chunk(bank, ledger, &mut kept, &mut progress, chunk)
        };
        assert_eq!(result.start, before);
        assert_eq!(result.end, progress.next_bank);
        assert_eq!(result.end, (before + chunk).min(bank.len()));
        let json = serde_json::to_string(&result).unwrap();
        report.push_chunk(serde_json::from_str(&json).unwrap());
        state = progress.to_bytes();
    }
}

fn assert_chunking_invariant(bank: &[Entry], ledger: &[Entry], tolerance: i32, sizes: &[usize]) {
    let whole = reconcile("2026-11-27", bank, ledger, tolerance);
    for &size in sizes {
        for fresh in [true, false] {
            let stepped = run_in_steps(bank, ledger, tolerance, size, fresh);
            assert_eq!(stepped, whole, "chunk size {size}, fresh matcher {fresh}");
        }
    }
}

#[test]
fn sample_is_the_same_in_any_chunking() {
    let (bank, ledger) = sample();
    assert_chunking_invariant(&bank, &ledger, 2, &[1, 2, 3, 5, 11, 12, 1000]);
}

#[test]
fn generated_is_the_same_in_any_chunking() {
    let data = generate(3_000, 7);
    let bank = parse_entries(&data.bank_csv, "bank.csv").unwrap();
    let ledger = parse_entries(&data.ledger_csv, "ledger.csv").unwrap();
    assert_chunking_invariant(&bank, &ledger, 2, &[3, 1000]);
    // Chunks of one line with a fresh matcher per step are O(n) each: test a smaller run.
    let data = generate(400, 8);
    let bank = parse_entries(&data.bank_csv, "bank.csv").unwrap();
    let ledger = parse_entries(&data.ledger_csv, "ledger.csv").unwrap();
    assert_chunking_invariant(&bank, &ledger, 2, &[1]);
}

#[test]
fn generated_data_reconciles_to_its_expected_totals() {
    for (rows, seed) in [(20_000, 1), (5_000, 42), (0, 3), (1, 4), (57, 5)] {
        let data = generate(rows, seed);
        let bank = parse_entries(&data.bank_csv, "bank.csv").unwrap();
        let ledger = parse_entries(&data.ledger_csv, "ledger.csv").unwrap();
        let report = reconcile("2026-11-27", &bank, &ledger, DEFAULT_TOLERANCE_DAYS);
        assert_eq!(report.totals, data.expected, "rows {rows}, seed {seed}");
        // A wider tolerance changes nothing: amounts never repeat across transactions.
        let wide = reconcile("2026-11-27", &bank, &ledger, 30);
        assert_eq!(wide.totals, data.expected);
    }
}

#[test]
fn generated_mix_is_realistic_and_deterministic() {
    let a = generate(20_000, 1);
    assert_eq!(a, generate(20_000, 1));
    assert_ne!(a.bank_csv, generate(20_000, 2).bank_csv);
    let t = &a.expected;
    let rows = 20_000.0;
    let share = |n: u64| n as f64 / rows;
    assert!(
        (0.88..0.92).contains(&share(t.matched_by_reference)),
        "{t:?}"
    );
    assert!(
        (0.02..0.04).contains(&share(t.matched_by_amount_date)),
        "{t:?}"
    );
    assert!((0.01..0.03).contains(&share(t.amount_mismatches)), "{t:?}");
    assert!(
        (0.015..0.035).contains(&share(t.missing_in_ledger)),
        "{t:?}"
    );
    assert!((0.015..0.035).contains(&share(t.missing_in_bank)), "{t:?}");
    assert!(a.bank_csv.contains("-"), "has negative amounts");
    assert!(
        a.bank_csv.contains("\"Smith, Jones & Partners"),
        "has quoted commas"
    );
    let with_date = generate_on(10, 1, parse_date("2025-01-02").unwrap());
    assert!(with_date.bank_csv.contains("2025-01-0"));
}

// ---- the rules, case by case ----

fn entries(file: &str, rows: &[(&str, &str, &str, &str)]) -> Vec<Entry> {
    let mut text = String::from("id,date,amount,reference,description\n");
    for (id, date, amount, reference) in rows {
        text.push_str(&format!("{id},{date},{amount},{reference},x\n"));
    }
    parse_entries(&text, file).unwrap()
}

fn pairs(report: &Report) -> Vec<(String, String)> {
    report
        .matched
        .iter()
        .map(|m| (m.bank_id.clone(), m.ledger_id.clone()))
        .collect()
}

#[test]
fn duplicate_references_take_the_first_unused_in_ledger_order() {
    let bank = entries(
        "bank.csv",
        &[
            ("B1", "2026-11-27", "10", "R"),
            ("B2", "2026-11-27", "20", "R"),
            ("B3", "2026-11-27", "30", "R"),
        ],
    );
    let ledger = entries(
        "ledger.csv",
        &[
            ("L1", "2026-11-01", "20", "R"),
            ("L2", "2026-11-27", "10", "R"),
            ("L3", "2026-11-27", "30", "r"),
        ],
    );
    let r = reconcile("d", &bank, &ledger, 2);
    // B1 takes L1 (first with R) although L2 has its amount: a mismatch.
    assert_eq!(r.mismatches.len(), 2);
    assert_eq!(
        (
            r.mismatches[0].bank_id.as_str(),
            r.mismatches[0].ledger_id.as_str()
        ),
        ("B1", "L1")
    );
    assert_eq!(r.mismatches[0].difference_cents, -1000);
    assert_eq!(
        (
            r.mismatches[1].bank_id.as_str(),
            r.mismatches[1].ledger_id.as_str()
        ),
        ("B2", "L2")
    );
    // References are case-sensitive; B3 then falls to rule 2 but L3 has a reference.
    assert_eq!(ids(&r.missing_in_ledger, |e| &e.id), ["B3"]);
    assert_eq!(ids(&r.missing_in_bank, |e| &e.id), ["L3"]);
}

#[test]
fn amount_date_nearest_date_then_file_order_and_tolerance() {
    let bank = entries(
        "bank.csv",
        &[
            ("B1", "2026-11-10", "5", ""),
            ("B2", "2026-11-10", "5", ""),
            ("B3", "2026-11-10", "5", ""),
            ("B4", "2026-11-10", "5", ""),
        ],
    );
    let ledger = entries(
        "ledger.csv",
        &[
            ("L1", "2026-11-13", "5", ""),    // 3 days: outside tolerance 2
            ("L2", "2026-11-12", "5", ""),    // 2 days later
            ("L3", "2026-11-08", "5", ""),    // 2 days earlier
            ("L4", "2026-11-11", "5", "REF"), // 1 day, has a reference
        ],
    );
    let r = reconcile("d", &bank, &ledger, 2);
    let expect = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        pairs(&r),
        expect(&[("B1", "L4"), ("B2", "L2"), ("B3", "L3")])
    );
    assert_eq!(ids(&r.missing_in_ledger, |e| &e.id), ["B4"]);
    assert_eq!(ids(&r.missing_in_bank, |e| &e.id), ["L1"]);

    let r = reconcile("d", &bank, &ledger, 3);
    assert_eq!(r.totals.matched, 4);
    let r = reconcile("d", &bank, &ledger, 0);
    assert_eq!(r.totals.matched, 0);
    let r = reconcile("d", &bank, &ledger, -5);
    assert_eq!((r.tolerance_days, r.totals.matched), (0, 0));
}

#[test]
fn bank_reference_without_counterpart_may_match_by_amount_date_only_without_ledger_reference() {
    let bank = entries("bank.csv", &[("B1", "2026-11-27", "7.5", "PO-1")]);
    let with_ref = entries("ledger.csv", &[("L1", "2026-11-27", "7.50", "PO-2")]);
    let r = reconcile("d", &bank, &with_ref, 2);
    assert_eq!(r.totals.matched, 0);
    assert_eq!(
        (r.totals.missing_in_ledger, r.totals.missing_in_bank),
        (1, 1)
    );

    let without_ref = entries("ledger.csv", &[("L1", "2026-11-26", "7.50", "")]);
    let r = reconcile("d", &bank, &without_ref, 2);
    assert_eq!(r.matched[0].kind, MatchKind::AmountDate);
    assert_eq!(r.matched[0].days_apart, -1);

    // A reference whose ledger entries are all used also falls through to rule 2.
    let bank = entries(
        "bank.csv",
        &[
            ("B1", "2026-11-27", "1", "R"),
            ("B2", "2026-11-27", "2", "R"),
        ],
    );
    let ledger = entries(
        "ledger.csv",
        &[
            ("L1", "2026-11-27", "1", "R"),
            ("L2", "2026-11-27", "2", ""),
        ],
    );
    let r = reconcile("d", &bank, &ledger, 2);
    assert_eq!(r.matched[1].kind, MatchKind::AmountDate);
    assert_eq!(r.matched[1].ledger_id, "L2");
}

#[test]
fn reused_matcher_with_a_fresh_progress_starts_over() {
    let (bank, ledger) = sample();
    let mut matcher = Matcher::new(&ledger, 2);
    let mut first = Progress::new(ledger.len());
    let a = reconcile_chunk(&bank, &ledger, &mut matcher, &mut first, 100);
    let mut second = Progress::new(ledger.len());
    let b = reconcile_chunk(&bank, &ledger, &mut matcher, &mut second, 100);
    assert_eq!(a, b);
    assert_eq!(first, second);
    // Nothing left: an empty chunk.
    let c = reconcile_chunk(&bank, &ledger, &mut matcher, &mut second, 100);
    assert!(c.is_empty());
    assert_eq!(
        reconcile_chunk(&bank, &ledger, &mut matcher, &mut first, 0).end,
        12
    );
}

#[test]
#[should_panic(expected = "does not fit the inputs")]
fn chunk_refuses_state_for_another_ledger() {
    let (bank, ledger) = sample();
    let mut matcher = Matcher::new(&ledger, 2);
    let mut progress = Progress::new(ledger.len() + 1);
    reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, 1);
}

#[test]
fn fingerprint_changes_with_any_input() {
    let base = input_fingerprint("a", "b", 2);
    assert_eq!(base, input_fingerprint("a", "b", 2));
    assert_ne!(base, input_fingerprint("a", "b", 3));
    assert_ne!(base, input_fingerprint("ab", "", 2));
    assert_ne!(base, input_fingerprint("b", "a", 2));
    assert_eq!(base, Fingerprint::new().file("a").file("b").finish(2));
}

#[test]
fn report_serialises_with_kebab_case_kinds() {
    let (bank, ledger) = sample();
    let json = serde_json::to_value(reconcile("2026-11-27", &bank, &ledger, 2)).unwrap();
    assert_eq!(json["date"], "2026-11-27");
    assert_eq!(json["matched"][3]["kind"], "amount-date");
    assert_eq!(json["matched"][0]["kind"], "reference");
    assert_eq!(json["missing_in_bank"][0]["date"], "2026-11-24");
    assert_eq!(json["totals"]["net_difference_cents"], -127_000);
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.totals.bank_total_cents, 741_669);
}

// ---- against a naive, literal implementation of the rules ----

struct Naive {
    matched: Vec<(String, String, MatchKind)>,
    mismatches: Vec<(String, String)>,
    missing_in_ledger: Vec<String>,
    missing_in_bank: Vec<String>,
}

fn naive(bank: &[Entry], ledger: &[Entry], tolerance: i32) -> Naive {
    let mut used = vec![false; ledger.len()];
    let mut out = Naive {
        matched: vec![],
        mismatches: vec![],
        missing_in_ledger: vec![],
        missing_in_bank: vec![],
    };
    for b in bank {
        if !b.reference.is_empty()
            && let Some(i) =
                (0..ledger.len()).find(|&i| !used[i] && ledger[i].reference == b.reference)
        {
            used[i] = true;
            if ledger[i].amount_cents == b.amount_cents {
                out.matched
                    .push((b.id.clone(), ledger[i].id.clone(), MatchKind::Reference));
            } else {
                out.mismatches.push((b.id.clone(), ledger[i].id.clone()));
            }
            continue;
        }
        let best = (0..ledger.len())
            .filter(|&i| {
                let l = &ledger[i];
                !used[i]
                    && l.amount_cents == b.amount_cents
                    && (l.date - b.date).abs() <= tolerance
                    && (b.reference.is_empty() || l.reference.is_empty())
            })
            .min_by_key(|&i| ((ledger[i].date - b.date).abs(), i));
        match best {
            Some(i) => {
                used[i] = true;
                out.matched
                    .push((b.id.clone(), ledger[i].id.clone(), MatchKind::AmountDate));
            }
            None => out.missing_in_ledger.push(b.id.clone()),
        }
    }
    for (i, l) in ledger.iter().enumerate() {
        if !used[i] {
            out.missing_in_bank.push(l.id.clone());
        }
    }
    out
}

fn random_entries(rng: &mut SplitMix64, prefix: &str, n: usize) -> Vec<Entry> {
    const REFS: [&str; 6] = ["", "", "", "A", "B", "C"];
    const AMOUNTS: [i64; 4] = [100, 200, -50, 300];
    (0..n)
        .map(|i| Entry {
            id: format!("{prefix}{i}"),
            date: 20_780 + rng.below(7) as i32,
            amount_cents: *rng.pick(&AMOUNTS),
            reference: rng.pick(&REFS).to_string(),
            description: String::new(),
        })
        .collect()
}

#[test]
fn agrees_with_naive_rules_on_collision_heavy_data() {
    let mut rng = SplitMix64::new(99);
    for case in 0..400 {
        let (bank_len, ledger_len) = (rng.below(40) as usize, rng.below(40) as usize);
        let bank = random_entries(&mut rng, "B", bank_len);
        let ledger = random_entries(&mut rng, "L", ledger_len);
        let tolerance = rng.below(4) as i32;
        let expected = naive(&bank, &ledger, tolerance);
        let got = reconcile("d", &bank, &ledger, tolerance);
        let got_matched: Vec<_> = got
            .matched
            .iter()
            .map(|m| (m.bank_id.clone(), m.ledger_id.clone(), m.kind))
            .collect();
        assert_eq!(got_matched, expected.matched, "case {case}");
        let got_mismatches: Vec<_> = got
            .mismatches
            .iter()
            .map(|m| (m.bank_id.clone(), m.ledger_id.clone()))
            .collect();
        assert_eq!(got_mismatches, expected.mismatches, "case {case}");
        assert_eq!(
            ids(&got.missing_in_ledger, |e| &e.id),
            expected.missing_in_ledger,
            "case {case}"
        );
        assert_eq!(
            ids(&got.missing_in_bank, |e| &e.id),
            expected.missing_in_bank,
            "case {case}"
        );
        let t = &got.totals;
        assert_eq!(t.matched, t.matched_by_reference + t.matched_by_amount_date);
        assert_eq!(
            t.bank_lines,
            t.matched + t.amount_mismatches + t.missing_in_ledger
        );
        assert_eq!(
            t.ledger_lines,
            t.matched + t.amount_mismatches + t.missing_in_bank
        );
        if case % 20 == 0 {
            assert_chunking_invariant(&bank, &ledger, tolerance, &[1, 3, 1000]);
        }
    }
}

#[test]
fn many_identical_candidates_stay_fast() {
    // 20,000 identical ledger entries and bank lines: quadratic scanning would be 2e8 steps.
    let n = 20_000;
    let make = |prefix: &str, reference: &str| -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                id: format!("{prefix}{i}"),
                date: 20_784,
                amount_cents: 999,
                reference: reference.to_string(),
                description: String::new(),
            })
            .collect()
    };
    for (bank_ref, ledger_ref) in [("", ""), ("R", "R"), ("X", "")] {
        let bank = make("B", bank_ref);
        let ledger = make("L", ledger_ref);
        let r = reconcile("d", &bank, &ledger, 2);
        assert_eq!(r.totals.matched, n as u64);
        assert_eq!(r.matched[n - 1].ledger_id, format!("L{}", n - 1));
    }
}

/// A million generated rows in ten steps, each with a fresh `Matcher` and state restored
/// from bytes. Slow in debug builds: run with `-- --ignored --nocapture`.
#[test]
#[ignore]
fn million_rows_in_steps() {
    let clock = std::time::Instant::now();
    let data = generate(1_000_000, 2026);
    let bank = parse_entries(&data.bank_csv, "bank.csv").unwrap();
    let ledger = parse_entries(&data.ledger_csv, "ledger.csv").unwrap();
    println!("generate + parse: {:?}", clock.elapsed());
    let clock = std::time::Instant::now();
    let mut state = Progress::new(ledger.len()).to_bytes();
    let mut steps = 0;
    loop {
        let mut progress = Progress::from_bytes(&state).unwrap();
        if progress.bank_done(bank.len()) {
            assert_eq!(progress.final_totals(&ledger), data.expected);
            break;
        }
        let build = std::time::Instant::now();
        let mut matcher = Matcher::new(&ledger, DEFAULT_TOLERANCE_DAYS);
        let built = build.elapsed();
        reconcile_chunk(&bank, &ledger, &mut matcher, &mut progress, 100_000);
        state = progress.to_bytes();
        if steps == 0 {
            println!(
                "first step: matcher {built:?}, whole step {:?}",
                build.elapsed()
            );
        }
        steps += 1;
    }
    println!(
        "{steps} steps: {:?}, state {} bytes",
        clock.elapsed(),
        state.len()
    );
}

/// Every part of the day reconciled alone (`parts` parts, chunks of `chunk` lines) and put
/// together from its fragments and summaries (through their bytes, as a task writes and returns
/// them) gives exactly the sequential run's bytes: each chunk, the missing-in-bank list, the
/// totals and the text report's listing.
fn assert_parts_invariant(
    bank: &[Entry],
    ledger: &[Entry],
    tolerance: i32,
    parts: u32,
    chunk: usize,
) {
    let p = partition(bank, ledger, parts);
    assert_eq!(
        p,
        partition(bank, ledger, parts),
        "the partition is deterministic"
    );
    let made: Vec<PartFragments> = (0..parts)
        .map(|i| report_part(bank.to_vec(), ledger.to_vec(), &p, i, chunk, tolerance))
        .collect();
    let summaries: Vec<PartSummary> = made
        .iter()
        .map(|m| serde_json::from_slice(&serde_json::to_vec(&m.summary).unwrap()).unwrap())
        .collect();
    let totals = sum_totals(&summaries).unwrap();
    let (mut listing, mut want_listing) = (Listing::new(3), Listing::new(3));
    let mut matcher = Matcher::new(ledger, tolerance);
    let mut sequential = Progress::new(ledger.len());
    let mut n = 0u32;
    while !sequential.bank_done(bank.len()) {
        let want = reconcile_chunk(bank, ledger, &mut matcher, &mut sequential, chunk);
        want_listing.take(&want);
        let fragments: Vec<&[u8]> = made
            .iter()
            .flat_map(|m| m.chunks.iter().filter(|c| c.0 == n).map(|c| c.1.as_slice()))
            .collect();
        let got = merge_chunk(want.start, want.end, &fragments, &mut listing).unwrap();
        assert!(
            got == serde_json::to_vec(&want).unwrap(),
            "chunk {n} of {parts} parts:\n{}\n{}",
            String::from_utf8_lossy(&got),
            serde_json::to_string(&want).unwrap()
        );
        n += 1;
    }
    assert_eq!(
        summaries
            .iter()
            .flat_map(|s| s.chunks.iter())
            .max()
            .map_or(0, |c| c + 1),
        n,
        "no fragment beyond the last chunk"
    );
    let missing: Vec<&[u8]> = made.iter().filter_map(|m| m.missing.as_deref()).collect();
    let (got, count) = merge_missing(&missing, ledger.len() as u64, &mut listing).unwrap();
    let want = missing_in_bank(ledger, &sequential);
    want_listing.take_missing_in_bank(&want);
    assert!(
        got == serde_json::to_vec(&want).unwrap(),
        "missing in bank, {parts} parts"
    );
    assert_eq!(count, want.len() as u64);
    assert_eq!(totals, sequential.final_totals(ledger), "{parts} parts");
    assert_eq!(listing, want_listing, "{parts} parts");
}

#[test]
fn parts_reconcile_exactly_as_one_pass() {
    let (bank, ledger) = sample();
    for parts in [1, 2, 3, 16] {
        assert_parts_invariant(&bank, &ledger, 2, parts, 4);
    }
    let data = generate(3_000, 11);
    let bank = parse_entries(&data.bank_csv, "bank.csv").unwrap();
    let ledger = parse_entries(&data.ledger_csv, "ledger.csv").unwrap();
    for parts in [1, 2, 7] {
        assert_parts_invariant(&bank, &ledger, 2, parts, 187);
    }
    // Every part has work on a generated day: its groups are small.
    let p = partition(&bank, &ledger, 4);
    for part in 0..4 {
        let n = p.bank.iter().filter(|x| **x == part).count();
        assert!(
            (600..=900).contains(&n),
            "part {part} has {n} of 3000 lines"
        );
    }
    // Collision-heavy days (few amounts and references, so few big groups).
    let mut rng = SplitMix64::new(5);
    for _ in 0..100 {
        let (b, l) = (rng.below(40) as usize, rng.below(40) as usize);
        let bank = random_entries(&mut rng, "B", b);
        let ledger = random_entries(&mut rng, "L", l);
        let tolerance = rng.below(4) as i32;
        let (parts, chunk) = (1 + rng.below(4) as u32, 1 + rng.below(9) as usize);
        assert_parts_invariant(&bank, &ledger, tolerance, parts, chunk);
    }
}

#[test]
fn parts_that_do_not_make_the_day_are_refused() {
    let (bank, ledger) = sample();
    let p = partition(&bank, &ledger, 2);
    let made: Vec<PartFragments> = (0..2)
        .map(|i| report_part(bank.clone(), ledger.clone(), &p, i, 100, 2))
        .collect();
    let [one, two] = [&made[0], &made[1]];
    let (a, b) = (one.chunks[0].1.as_slice(), two.chunks[0].1.as_slice());
    let mut listing = Listing::new(10);
    let end = bank.len();
    assert!(merge_chunk(0, end, &[a, b], &mut listing).is_ok());
    // A part missing: its lines are in no part.
    let e = merge_chunk(0, end, &[a], &mut listing).unwrap_err();
    assert!(e.0.contains("in no part"), "{e}");
    // A part twice: its lines are in two parts.
    let e = merge_chunk(0, end, &[a, b, a], &mut listing).unwrap_err();
    assert!(e.0.contains("in two parts"), "{e}");
    // Lines outside the chunk, a cut record, an unknown kind.
    assert!(merge_chunk(0, 3, &[a, b], &mut listing).is_err());
    assert!(merge_chunk(0, end, &[&a[..a.len() - 1], b], &mut listing).is_err());
    let mut bad = a.to_vec();
    bad[4] = 9;
    assert!(merge_chunk(0, end, &[&bad, b], &mut listing).is_err());
    // Summaries: one missing, one twice, one of another day, lines short.
    let (s1, s2) = (one.summary.clone(), two.summary.clone());
    assert!(sum_totals(&[s1.clone(), s2.clone()]).is_ok());
    assert!(sum_totals(&[s1.clone()]).is_err());
    assert!(sum_totals(&[s1.clone(), s1.clone()]).is_err());
    let mut other = s2.clone();
    other.bank_len += 1;
    assert!(sum_totals(&[s1.clone(), other]).is_err());
    let mut short = s2.clone();
    short.totals.bank_lines -= 1;
    assert!(sum_totals(&[s1.clone(), short]).is_err());
    // Amounts whose sum could saturate: refused, not guessed.
    let mut huge = s2;
    huge.bank_abs_cents = u64::MAX;
    let e = sum_totals(&[s1, huge]).unwrap_err();
    assert!(e.0.contains("i64 range"), "{e}");
    // Unused entries twice, or beyond the ledger.
    let m = one.missing.as_deref().or(two.missing.as_deref()).unwrap();
    assert!(merge_missing(&[m, m], ledger.len() as u64, &mut listing).is_err());
    assert!(merge_missing(&[m], 1, &mut listing).is_err());
}
