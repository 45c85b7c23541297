//! Durations and sizes as people write and read them: `500ms`, `3s`, `1m 30s`; `512MiB`,
//! `64 KiB`, `1000`.

use std::time::Duration;

/// Formats a duration the way the CLI accepts it (`500ms`, `3s`, `1m 30s`).
pub fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Parses a duration (`500ms`, `3s`, `1m`); the error says how to write one.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 3s, 1m)"))
}

/// Parses a size in bytes: a whole number with an optional unit, `B`, `KiB`, `MiB`, `GiB`
/// (powers of 1024) or `kB`, `MB`, `GB` (powers of 1000), e.g. `512MiB`, `64 KiB`, `1000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let num: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (use e.g. 512MiB, 64KiB, 1000)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, kB, MB or GB)"
            ));
        }
    };
    num.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Formats a size for people: `512 MiB`, `64 KiB`, `1000 bytes`.
pub fn show_size(n: u64) -> String {
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= scale && n.is_multiple_of(scale) {
            return format!("{} {unit}", n / scale);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_name_bad_input() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(
            parse_size("3 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(
            parse_size("99999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
        assert_eq!(show_size(512 << 20), "512 MiB");
        assert_eq!(show_size(1000), "1000 bytes");
    }

    #[test]
    fn durations_parse_and_show_alike() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(show(Duration::from_secs(90)), "1m 30s");
        assert!(parse_duration("soon").unwrap_err().contains("use e.g."));
    }
}
