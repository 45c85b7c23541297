//! Reading `bank.csv` / `ledger.csv` into [`Entry`] values.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::amount::parse_amount;
use crate::date::parse_date;
use crate::hash::FastMap;

/// The header row both files must start with, exactly.
pub const HEADER: [&str; 5] = ["id", "date", "amount", "reference", "description"];

/// One line of the bank statement or of the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique (within its file), non-empty identifier.
    pub id: String,
    /// Day number: days since 1970-01-01 (see [`crate::parse_date`]).
    pub date: i32,
    /// Signed amount in cents.
    pub amount_cents: i64,
    /// Payment reference; may be empty.
    pub reference: String,
    /// Free text.
    pub description: String,
}

/// Why a file could not be read: which file, which line (1-based, the header is line 1),
/// which field if any, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The file name given to [`parse_entries`].
    pub file: String,
    /// 1-based line number where the offending record starts.
    pub line: u64,
    /// The offending column, when the problem is in one field.
    pub field: Option<&'static str>,
    /// Human-readable reason.
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, line {}", self.file, self.line)?;
        if let Some(field) = self.field {
            write!(f, ", field {field}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ParseError {}

/// A file's entries and how many lines it had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The entries, in file order.
    pub entries: Vec<Entry>,
    /// Every physical line read, the header and blank lines included (`wc -l`, plus one when
    /// the last line has no line end): a reader can check it against the file.
    pub lines: u64,
}

/// Parses a CSV file with the header `id,date,amount,reference,description`: its entries
/// ([`read_entries`] also says how many lines it read).
pub fn parse_entries(csv_text: &str, file_name: &str) -> Result<Vec<Entry>, ParseError> {
    read_entries(csv_text, file_name).map(|p| p.entries)
}

/// Parses a CSV file with the header `id,date,amount,reference,description`.
///
/// The CSV must be well-formed ([`crate::strict_csv`]: an unclosed quote, text after a closing
/// quote, a quote inside an unquoted field, a lone CR or a NUL byte refuses the file, naming
/// the line where the problem starts), so no line is ever read short. `date` is a strict
/// `YYYY-MM-DD`; `amount` is a decimal with up to two fractional digits and an optional
/// leading `-`; `id` must be non-empty and unique in the file; `reference` and `description`
/// may be empty. No field is trimmed: stray spaces in `date` or `amount` are errors. A leading
/// UTF-8 byte-order mark and blank lines are skipped (blank lines are counted); a second header
/// line (two files joined) is refused.
pub fn read_entries(csv_text: &str, file_name: &str) -> Result<Parsed, ParseError> {
    let text = csv_text.strip_prefix('\u{feff}').unwrap_or(csv_text);
    let error = |line: u64, field: Option<&'static str>, reason: String| ParseError {
        file: file_name.to_string(),
        line,
        field,
        reason,
    };
    let mut entries = Vec::new();
    // Each entry's line, for the line of a duplicate id.
    let mut lines_of: Vec<u64> = Vec::new();
    let mut header = false;
    let lines = crate::strict_csv::read_records(
        text,
        |line, record| {
            if !header {
                header = true;
                if record.iter().map(|f| f.as_ref()).ne(HEADER.iter().copied()) {
                    return Err(error(
                        line,
                        None,
                        format!(
                            "expected header {:?}, found {:?}",
                            HEADER.join(","),
                            record.join(",")
                        ),
                    ));
                }
                return Ok(());
            }
            if record.len() != HEADER.len() {
                return Err(error(
                    line,
                    None,
                    format!("expected {} fields, found {}", HEADER.len(), record.len()),
                ));
            }
            if record.iter().map(|f| f.as_ref()).eq(HEADER.iter().copied()) {
                return Err(error(
                    line,
                    None,
                    "the header line again: are two files joined together?".to_string(),
                ));
            }
            let id = &record[0];
            if id.is_empty() {
                return Err(error(line, Some("id"), "empty id".to_string()));
            }
            let date = parse_date(&record[1]).ok_or_else(|| {
                error(
                    line,
                    Some("date"),
                    format!(
                        "invalid date {:?}: expected a real calendar date as YYYY-MM-DD",
                        &record[1]
                    ),
                )
            })?;
            let amount_cents =
                parse_amount(&record[2]).map_err(|reason| error(line, Some("amount"), reason))?;
            lines_of.push(line);
            entries.push(Entry {
                id: id.to_string(),
                date,
                amount_cents,
                reference: record[3].to_string(),
                description: record[4].to_string(),
            });
            Ok(())
        },
        |e| error(e.line, None, format!("malformed CSV: {}", e.reason)),
    )?;
    if !header {
        return Err(error(1, None, "missing header row".to_string()));
    }
    // Ids are unique: the first line that repeats one is reported, with the line it repeats.
    let mut first_of_id: FastMap<&str, usize> =
        FastMap::with_capacity_and_hasher(entries.len(), Default::default());
    for (i, e) in entries.iter().enumerate() {
        if let Some(&first) = first_of_id.get(e.id.as_str()) {
            return Err(error(
                lines_of[i],
                Some("id"),
                format!(
                    "duplicate id {:?} (first used on line {})",
                    e.id, lines_of[first]
                ),
            ));
        }
        first_of_id.insert(e.id.as_str(), i);
    }
    if entries.len() >= u32::MAX as usize {
        return Err(error(0, None, "too many lines".to_string()));
    }
    Ok(Parsed { entries, lines })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "id,date,amount,reference,description\n";

    fn parse(body: &str) -> Result<Vec<Entry>, ParseError> {
        parse_entries(&format!("{HEAD}{body}"), "bank.csv")
    }

    #[test]
    fn parses_quoted_fields_and_empty_reference() {
        let entries = parse(
            "B1,2026-11-27,1250.00,INV-1042,ACME LTD invoice INV-1042\n\
             \"B2\",2026-11-26,-75.5,,\"Smith, Jones & Partners \"\"fee\"\"\"\n\
             \n\
             B3,2026-11-25,3,\"\",\n",
        )
        .unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].amount_cents, 125_000);
        assert_eq!(entries[0].reference, "INV-1042");
        assert_eq!(entries[1].id, "B2");
        assert_eq!(entries[1].amount_cents, -7_550);
        assert_eq!(entries[1].reference, "");
        assert_eq!(entries[1].description, "Smith, Jones & Partners \"fee\"");
        assert_eq!(entries[1].date, parse_date("2026-11-26").unwrap());
        assert_eq!(entries[2].amount_cents, 300);
        assert_eq!(entries[2].description, "");
    }

    #[test]
    fn header_only_is_empty_and_bom_is_ignored() {
        assert_eq!(parse("").unwrap(), vec![]);
        let with_bom = format!("\u{feff}{HEAD}B1,2026-11-27,1,,x\n");
        assert_eq!(parse_entries(&with_bom, "bank.csv").unwrap().len(), 1);
        // No trailing newline at the end of the file.
        assert_eq!(parse("B1,2026-11-27,1,,x").unwrap().len(), 1);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let err = parse("B1,2026-11-27,1.00,,ok\nB2,2026-11-27,12.345,,bad\n").unwrap_err();
        assert_eq!(err.file, "bank.csv");
        assert_eq!(err.line, 3);
        assert_eq!(err.field, Some("amount"));
        let text = err.to_string();
        assert!(text.starts_with("bank.csv, line 3, field amount: invalid amount \"12.345\""));

        let err = parse("B1,2026-02-30,1.00,,x\n").unwrap_err();
        assert_eq!((err.line, err.field), (2, Some("date")));
        assert!(err.to_string().contains("2026-02-30"), "{err}");

        let err = parse("B1,2026-02-03,1.00,x\n").unwrap_err();
        assert_eq!((err.line, err.field), (2, None));
        assert!(err.reason.contains("expected 5 fields, found 4"));

        let err = parse(",2026-02-03,1.00,,x\n").unwrap_err();
        assert_eq!((err.line, err.field), (2, Some("id")));

        let err =
            parse("B1,2026-11-27,1,,x\nB2,2026-11-27,1,,x\n\nB1,2026-11-27,2,,y\n").unwrap_err();
        assert_eq!((err.line, err.field), (5, Some("id")));
        assert!(
            err.reason
                .contains("duplicate id \"B1\" (first used on line 2)")
        );
    }

    #[test]
    fn multi_line_quoted_field_keeps_line_numbers_right() {
        let err = parse("B1,2026-11-27,1,,\"two\nlines\"\nB2,2026-11-27,x,,y\n").unwrap_err();
        assert_eq!((err.line, err.field), (4, Some("amount")));
        let err = parse_entries(
            "id,date,amount,reference,description\r\n\r\nB1,2026-11-27,1,,x\r\n\r\n\r\nB2,2026-11-27,1.,,y\r\n",
            "bank.csv",
        )
        .unwrap_err();
        assert_eq!((err.line, err.field), (6, Some("amount")));
    }

    #[test]
    fn header_is_checked() {
        let err = parse_entries("id,date,amount,ref,description\n", "ledger.csv").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(
            err.to_string()
                .starts_with("ledger.csv, line 1: expected header")
        );
        let err = parse_entries("", "ledger.csv").unwrap_err();
        assert_eq!(err.to_string(), "ledger.csv, line 1: missing header row");
    }

    #[test]
    fn every_line_is_counted_and_malformed_files_are_refused_at_their_line() {
        // The header, an entry, a blank line, an entry whose description spans two: five lines.
        let parsed = read_entries(
            &format!("{HEAD}B1,2026-11-27,1,,x\n\nB2,2026-11-27,2,,\"two\nlines\"\n"),
            "bank.csv",
        )
        .unwrap();
        assert_eq!((parsed.entries.len(), parsed.lines), (2, 5));
        // No final line end: the last line still counts.
        assert_eq!(
            read_entries(&format!("{HEAD}B1,2026-11-27,1,,x"), "b")
                .unwrap()
                .lines,
            2
        );
        let cases = [
            (
                "B1,2026-11-27,1,,\"open\nB2,2026-11-27,2,,y\n",
                2,
                "never closes",
            ),
            ("B1,2026-11-27,1,,\"ab\"c\n", 2, "after the closing quote"),
            (
                "B1,2026-11-27,1,R\"1,x\n",
                2,
                "quote inside an unquoted field",
            ),
            (
                "B1,2026-11-27,1,,x\rB2,2026-11-27,2,,y\r",
                2,
                "carriage return",
            ),
            ("B1,2026-11-27,1,,x\nB2,2026-11-27,2,,\0\n", 3, "NUL"),
            (
                "B1,2026-11-27,1,,x\nid,date,amount,reference,description\n",
                3,
                "header line again",
            ),
        ];
        for (body, line, why) in cases {
            let err = parse(body).unwrap_err();
            assert_eq!(err.line, line, "{body:?}: {err}");
            assert!(err.reason.contains(why), "{body:?}: {err}");
        }
    }
}
