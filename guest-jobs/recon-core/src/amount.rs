//! Money as integer cents: parsing `1250.00`, `-75.5`, `3` and printing `1234.56`.

/// Largest accepted absolute amount, in cents (999,999,999,999.99).
pub const MAX_AMOUNT_CENTS: i64 = 99_999_999_999_999;

/// Parses a decimal amount with up to two fractional digits and an optional leading `-`
/// into cents. Anything else (`+5`, `1,000.00`, `1.`, `.5`, `1.234`, spaces, exponents) is
/// rejected with a reason.
pub fn parse_amount(text: &str) -> Result<i64, String> {
    let explain = || {
        format!(
            "invalid amount {text:?}: expected digits with up to 2 decimals, e.g. 1250.00, -75.5 or 3"
        )
    };
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match rest.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (rest, None),
    };
    if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) {
        return Err(explain());
    }
    let mut cents: i64 = 0;
    for c in whole.bytes() {
        cents = cents
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(c - b'0')))
            .filter(|v| *v <= MAX_AMOUNT_CENTS / 100)
            .ok_or_else(|| format!("amount {text:?} is too large (limit 999999999999.99)"))?;
    }
    cents *= 100;
    if let Some(f) = fraction {
        if f.is_empty() || f.len() > 2 || !f.bytes().all(|c| c.is_ascii_digit()) {
            return Err(explain());
        }
        let mut digits = f.bytes().map(|c| i64::from(c - b'0'));
        cents += digits.next().unwrap_or(0) * 10 + digits.next().unwrap_or(0);
    }
    Ok(if negative { -cents } else { cents })
}

/// Formats cents as a plain decimal with two fractional digits: `1234.56`, `-0.05`, `0.00`.
pub fn format_cents(cents: i64) -> String {
    let magnitude = cents.unsigned_abs();
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", magnitude / 100, magnitude % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_amounts() {
        assert_eq!(parse_amount("1250.00"), Ok(125_000));
        assert_eq!(parse_amount("-75.5"), Ok(-7_550));
        assert_eq!(parse_amount("3"), Ok(300));
        assert_eq!(parse_amount("0.07"), Ok(7));
        assert_eq!(parse_amount("-0.07"), Ok(-7));
        assert_eq!(parse_amount("-0"), Ok(0));
        assert_eq!(parse_amount("007.10"), Ok(710));
        assert_eq!(parse_amount("999999999999.99"), Ok(MAX_AMOUNT_CENTS));
        assert_eq!(parse_amount("-999999999999.99"), Ok(-MAX_AMOUNT_CENTS));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "-",
            ".",
            "1.",
            ".5",
            "-.5",
            "+5",
            "1.234",
            "1,000.00",
            "1 000",
            " 5",
            "5 ",
            "1e3",
            "--5",
            "5-",
            "1.2.3",
            "0x10",
            "NaN",
            "١٢",
            "1000000000000",
        ] {
            assert!(parse_amount(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(
            parse_amount("1000000000000")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_amount("99999999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn formats_cents() {
        assert_eq!(format_cents(123_456), "1234.56");
        assert_eq!(format_cents(-1_250), "-12.50");
        assert_eq!(format_cents(-5), "-0.05");
        assert_eq!(format_cents(0), "0.00");
        assert_eq!(format_cents(7), "0.07");
        assert_eq!(format_cents(i64::MIN), "-92233720368547758.08");
    }
}
