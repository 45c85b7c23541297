//! Civil dates (`YYYY-MM-DD`, proleptic Gregorian) as day numbers: days since 1970-01-01.

/// Days before the first of each month in a common year.
const DAYS_BEFORE_MONTH: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];

/// True for Gregorian leap years.
pub fn is_leap_year(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Number of days in `month` (1–12) of `year`; 0 for a month out of range.
pub fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap_year(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 0001-01-01 to `year`-01-01 (negative for years before 1).
const fn days_before_year(year: i64) -> i64 {
    let p = year - 1;
    365 * p + p.div_euclid(4) - p.div_euclid(100) + p.div_euclid(400)
}

/// Days from 0001-01-01 to 1970-01-01.
const UNIX_EPOCH_OFFSET: i64 = days_before_year(1970);

/// Day number of a valid civil date, or `None` when the month or day is out of range or the
/// result does not fit an `i32`.
pub fn days_from_civil(year: i32, month: u32, day: u32) -> Option<i32> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let leap_day = i64::from(month > 2 && is_leap_year(year));
    let n = days_before_year(i64::from(year))
        + DAYS_BEFORE_MONTH[month as usize - 1]
        + leap_day
        + i64::from(day)
        - 1;
    i32::try_from(n - UNIX_EPOCH_OFFSET).ok()
}

/// The civil date `(year, month, day)` of a day number.
pub fn civil_from_days(days: i32) -> (i32, u32, u32) {
    let n = i64::from(days) + UNIX_EPOCH_OFFSET;
    // First guess from the mean Gregorian year, then correct by at most a step or two.
    let mut year = n.div_euclid(146_097) * 400 + n.rem_euclid(146_097) * 400 / 146_097 + 1;
    while days_before_year(year + 1) <= n {
        year += 1;
    }
    while days_before_year(year) > n {
        year -= 1;
    }
    let mut day_of_year = n - days_before_year(year);
    let year = year as i32;
    let mut month = 1;
    while month < 12 {
        let len = i64::from(days_in_month(year, month));
        if day_of_year < len {
            break;
        }
        day_of_year -= len;
        month += 1;
    }
    (year, month, day_of_year as u32 + 1)
}

/// Parses a strict `YYYY-MM-DD` date (four-digit year 0001–9999) into a day number.
pub fn parse_date(text: &str) -> Option<i32> {
    let b = text.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let mut value = 0u32;
        for &c in &b[range] {
            if !c.is_ascii_digit() {
                return None;
            }
            value = value * 10 + u32::from(c - b'0');
        }
        Some(value)
    };
    let year = number(0..4)?;
    if year == 0 {
        return None;
    }
    days_from_civil(year as i32, number(5..7)?, number(8..10)?)
}

/// Formats a day number as `YYYY-MM-DD`.
pub fn format_date(days: i32) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_day_numbers() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("1970-01-02"), Some(1));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        assert_eq!(parse_date("2000-01-01"), Some(10_957));
        assert_eq!(parse_date("2000-03-01"), Some(11_017));
        // 56 years * 365 + 14 leap days (1972..=2024) + 304 (Jan..Oct) + 26.
        assert_eq!(parse_date("2026-11-27"), Some(20_784));
        assert_eq!(parse_date("0001-01-01"), Some(-719_162));
        assert_eq!(parse_date("9999-12-31"), Some(2_932_896));
    }

    #[test]
    fn leap_rules() {
        assert!(parse_date("2024-02-29").is_some());
        assert!(parse_date("2000-02-29").is_some());
        assert!(parse_date("2023-02-29").is_none());
        assert!(parse_date("1900-02-29").is_none());
        assert_eq!(
            parse_date("2024-03-01").unwrap() - parse_date("2024-02-28").unwrap(),
            2
        );
        assert_eq!(
            parse_date("2023-03-01").unwrap() - parse_date("2023-02-28").unwrap(),
            1
        );
    }

    #[test]
    fn rejects_invalid_dates_and_formats() {
        for bad in [
            "2026-02-30",
            "2026-04-31",
            "2026-13-01",
            "2026-00-10",
            "2026-01-00",
            "2026-1-05",
            "2026/01/05",
            "26-01-05",
            "2026-01-05 ",
            " 2026-01-05",
            "2026-01-0x",
            "0000-01-01",
            "+026-01-01",
            "",
        ] {
            assert_eq!(parse_date(bad), None, "{bad:?} should be rejected");
        }
    }

    #[test]
    fn round_trips_every_day_over_a_wide_range() {
        let mut expected = (1600, 1, 1);
        let start = days_from_civil(1600, 1, 1).unwrap();
        let end = days_from_civil(2500, 12, 31).unwrap();
        for days in start..=end {
            assert_eq!(civil_from_days(days), expected, "day {days}");
            let (y, m, d) = expected;
            assert_eq!(days_from_civil(y, m, d), Some(days));
            assert_eq!(parse_date(&format_date(days)), Some(days));
            expected = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
        }
    }

    #[test]
    fn civil_from_days_extremes() {
        for days in [i32::MIN, -1_000_000_000, -1, 0, 1_000_000_000, i32::MAX] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days));
        }
    }
}
