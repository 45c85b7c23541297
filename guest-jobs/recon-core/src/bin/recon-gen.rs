//! `recon-gen --rows N [--seed S] --out DIR [--date YYYY-MM-DD]`
//!
//! Writes `DIR/bank.csv` and `DIR/ledger.csv` of synthetic reconciliation data and prints
//! the totals that reconciling them must give, as JSON, on standard output.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: recon-gen --rows N [--seed S] --out DIR [--date YYYY-MM-DD]";
const MAX_ROWS: usize = 50_000_000;

struct Args {
    rows: usize,
    seed: u64,
    out: PathBuf,
    date: i32,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut rows = None;
    let mut seed = 1u64;
    let mut out = None;
    let mut date = recon_core::parse_date(recon_core::DEFAULT_GENERATED_DATE);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (flag.clone(), None),
        };
        if !matches!(name.as_str(), "--rows" | "--seed" | "--out" | "--date") {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(format!("{name} needs a value")),
        };
        match name.as_str() {
            "--rows" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| format!("--rows: {value:?} is not a non-negative integer"))?;
                if n > MAX_ROWS {
                    return Err(format!("--rows: at most {MAX_ROWS}"));
                }
                rows = Some(n);
            }
            "--seed" => {
                seed = value
                    .parse()
                    .map_err(|_| format!("--seed: {value:?} is not an unsigned 64-bit integer"))?;
            }
            "--out" => {
                if value.is_empty() {
                    return Err("--out: empty path".to_string());
                }
                out = Some(PathBuf::from(value));
            }
            _ => {
                date =
                    Some(recon_core::parse_date(&value).ok_or_else(|| {
                        format!("--date: {value:?} is not a valid YYYY-MM-DD date")
                    })?);
            }
        }
    }
    Ok(Some(Args {
        rows: rows.ok_or("--rows is required")?,
        seed,
        out: out.ok_or("--out is required")?,
        date: date.expect("default date is valid"),
    }))
}

fn run(args: Args) -> Result<String, String> {
    let data = recon_core::generate_on(args.rows, args.seed, args.date);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    for (name, text) in [
        ("bank.csv", &data.bank_csv),
        ("ledger.csv", &data.ledger_csv),
    ] {
        let path = args.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    serde_json::to_string_pretty(&data.expected).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)) {
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Some(args)) => match run(args) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("recon-gen: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("recon-gen: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_all_flags() {
        let a = parse(&[
            "--rows",
            "10",
            "--seed=5",
            "--out",
            "/tmp/x",
            "--date",
            "2025-01-31",
        ])
        .unwrap()
        .unwrap();
        assert_eq!((a.rows, a.seed), (10, 5));
        assert_eq!(a.out, PathBuf::from("/tmp/x"));
        assert_eq!(a.date, recon_core::parse_date("2025-01-31").unwrap());
        assert!(parse(&["--help"]).unwrap().is_none());
    }

    #[test]
    fn reports_bad_arguments() {
        let err = |args: &[&str]| parse(args).err().unwrap();
        assert_eq!(err(&["--out", "d"]), "--rows is required");
        assert_eq!(err(&["--rows", "3"]), "--out is required");
        assert!(err(&["--rows", "-3", "--out", "d"]).contains("not a non-negative integer"));
        assert!(err(&["--rows", "3", "--out", "d", "--date", "2026-02-30"]).contains("--date"));
        assert!(err(&["--rows"]).contains("needs a value"));
        assert!(err(&["--bogus"]).contains("unknown argument"));
        assert!(err(&["--rows", "3", "--out", "d", "--seed", "x"]).contains("--seed"));
    }
}
