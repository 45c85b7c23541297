//! Runs the `recon-gen` binary end to end.

use std::path::PathBuf;
use std::process::Command;

fn recon_gen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_recon-gen"))
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recon-gen-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn writes_files_whose_reconciliation_gives_the_printed_totals() {
    let dir = scratch_dir("ok");
    let out = recon_gen()
        .args([
            "--rows",
            "2500",
            "--seed",
            "11",
            "--date",
            "2026-03-01",
            "--out",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: recon_core::Totals = serde_json::from_slice(&out.stdout).unwrap();

    let bank_text = std::fs::read_to_string(dir.join("bank.csv")).unwrap();
    let ledger_text = std::fs::read_to_string(dir.join("ledger.csv")).unwrap();
    assert!(bank_text.starts_with("id,date,amount,reference,description\n"));
    assert!(bank_text.contains(",2026-03-01,"));
    let bank = recon_core::parse_entries(&bank_text, "bank.csv").unwrap();
    let ledger = recon_core::parse_entries(&ledger_text, "ledger.csv").unwrap();
    let report = recon_core::reconcile("2026-03-01", &bank, &ledger, 2);
    assert_eq!(report.totals, printed);
    assert_eq!(
        printed,
        recon_core::generate_on(2500, 11, recon_core::parse_date("2026-03-01").unwrap()).expected
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_exit_with_status_2_and_a_message() {
    for args in [
        &["--out", "/nonexistent/x"][..],
        &["--rows", "ten", "--out", "x"],
        &["--rows", "3", "--out", "x", "--date", "2026-02-30"],
        &["--frobnicate"],
    ] {
        let out = recon_gen().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("recon-gen: "), "{stderr}");
        assert!(stderr.contains("usage: recon-gen"), "{stderr}");
    }
    let help = recon_gen().arg("--help").output().unwrap();
    assert!(help.status.success());
}
