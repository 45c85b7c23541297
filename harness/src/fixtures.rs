//! Input data written for a run: a generated reconciliation day (recon-core's generator), as
//! the demo and the benchmarks use it.

use std::path::Path;

/// A generated day: the bank statement and ledger CSVs and the totals a correct
/// reconciliation of them reports.
pub use recon_core::Generated;
/// The totals of a reconciliation (a report's `totals`).
pub use recon_core::Totals;

/// Generates a day of `rows` transactions from `seed`, dated `period` (`YYYY-MM-DD`), and
/// writes it as `<data_dir>/<job>/<period>/bank.csv` and `ledger.csv` (creating the
/// directories), where a host started with `--data-dir <data_dir>` gives it to `job`'s run of
/// `period`, and `<data_dir>/<job>/step-budget` as `0`: the reconciliation then reconciles one
/// chunk per step, so that every run has steps to stop and resume between (what the demo and
/// the failover tests show); delete it for the job's own budget. Returns what was generated,
/// with the expected totals.
pub fn write_generated_day(
    data_dir: &Path,
    job: &str,
    period: &str,
    rows: usize,
    seed: u64,
) -> std::io::Result<Generated> {
    let date = recon_core::parse_date(period).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{period:?} is not a date (YYYY-MM-DD)"),
        )
    })?;
    let generated = recon_core::generate_on(rows, seed, date);
    let day = data_dir.join(job).join(period);
    std::fs::create_dir_all(&day)?;
    std::fs::write(day.join("bank.csv"), &generated.bank_csv)?;
    std::fs::write(day.join("ledger.csv"), &generated.ledger_csv)?;
    std::fs::write(data_dir.join(job).join("step-budget"), "0")?;
    Ok(generated)
}

/// Deploys the `billing` job under `dir`: `jobs/billing.wasm`, and `data/billing/customers.csv`
/// with `customers` customers (`c0000` owing 100 cents, `c0001` 101, …). Returns the jobs and
/// the data directory.
pub fn deploy_billing(dir: &Path, customers: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let (jobs, data) = (dir.join("jobs"), dir.join("data"));
    std::fs::create_dir_all(&jobs).unwrap();
    std::fs::create_dir_all(data.join("billing")).unwrap();
    std::fs::copy(crate::guests().wasm("billing"), jobs.join("billing.wasm")).unwrap();
    let mut csv = String::from("customer,amount_cents\n");
    for i in 0..customers {
        csv.push_str(&format!("c{i:04},{}\n", 100 + i));
    }
    std::fs::write(data.join("billing/customers.csv"), csv).unwrap();
    (jobs, data)
}

/// The token a billing charge booked in the store was made under: its value is
/// `<amount> token=<token> attempt=<attempt>` (`guest-jobs/billing`).
pub fn billing_charge_token(value: &str) -> Option<u64> {
    value
        .split(' ')
        .find_map(|p| p.strip_prefix("token="))
        .and_then(|t| t.parse().ok())
}

/// A new version of a component: the same code with a custom section carrying `tag` appended
/// (valid anywhere in a component), so its content hash — the version a run record names —
/// differs.
pub fn new_version(component: &[u8], tag: &str) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"leasehold-test-version";
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name);
    content.extend_from_slice(tag.as_bytes());
    let mut out = component.to_vec();
    out.push(0);
    leb(content.len(), &mut out);
    out.extend_from_slice(&content);
    out
}
