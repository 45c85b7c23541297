//! The three pieces of Python's standard library that `settlement-py` leans on, so that this
//! job reads its inputs exactly as the Python job does: [`csv_records`] (`csv.reader` over a
//! file opened with `newline=""`), [`strip`] (`str.strip()`) and [`int`] (`int(text)`).

use std::mem::take;

/// `csv.field_size_limit()`'s default: the most characters a field may hold.
pub const FIELD_LIMIT: usize = 131_072;

/// `list(csv.reader(f))` for a file `f` opened with `newline=""` and holding `text`: the
/// records, in order, each as its fields. The default dialect (`excel`): fields separated by
/// `,`; a field that starts with `"` is quoted, holds `""` as one `"` and may span lines; a line
/// ending (`\n`, `\r\n` or `\r`) outside quotes ends the record; an empty line is an empty
/// record. Not strict: a character after a closing quote continues the field unquoted, and a
/// quote left open at the end of the text ends its field there.
///
/// The error is `csv.Error`'s message: a field longer than [`FIELD_LIMIT`] characters.
pub fn csv_records(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut reader = Reader::default();
    let mut records = Vec::new();
    for line in lines(text) {
        for c in line.chars() {
            reader.process(Some(c))?;
        }
        reader.process(None)?;
        // Otherwise a quoted field goes on on the next line.
        if reader.state == State::StartRecord {
            records.push(take(&mut reader.fields));
        }
    }
    if reader.field_len != 0 || reader.state == State::InQuotedField {
        reader.save_field();
        records.push(take(&mut reader.fields));
    }
    Ok(records)
}

/// The lines of `text` as a file opened with `newline=""` yields them: each ends after `\n`,
/// `\r\n` or a lone `\r` (kept), the last one possibly without an ending.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = match rest.find(['\n', '\r']) {
            None => rest.len(),
            Some(i) if rest[i..].starts_with("\r\n") => i + 2,
            Some(i) => i + 1,
        };
        let (line, tail) = rest.split_at(end);
        rest = tail;
        Some(line)
    })
}

/// Where the reader is in a record (the states of CPython's `_csv.c`, less the escape ones:
/// the default dialect has no escape character).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    StartRecord,
    StartField,
    InField,
    InQuotedField,
    QuoteInQuotedField,
    EatCrnl,
}

/// The record being read.
#[derive(Default)]
struct Reader {
    state: State,
    fields: Vec<String>,
    field: String,
    /// `field`'s length in characters.
    field_len: usize,
}

impl Reader {
    /// Takes one character of a line, or `None` at the end of the line.
    fn process(&mut self, c: Option<char>) -> Result<(), String> {
        use State::*;
        match (self.state, c) {
            (StartRecord, None) => {}
            (StartRecord, Some('\n' | '\r')) => self.state = EatCrnl,
            (StartRecord, Some(_)) => {
                self.state = StartField;
                return self.process(c);
            }
            (StartField | InField | QuoteInQuotedField, None | Some('\n' | '\r')) => {
                self.save_field();
                self.state = if c.is_none() { StartRecord } else { EatCrnl };
            }
            (StartField | InField | QuoteInQuotedField, Some(',')) => {
                self.save_field();
                self.state = StartField;
            }
            (StartField, Some('"')) => self.state = InQuotedField,
            (StartField, Some(c)) => {
                self.add(c)?;
                self.state = InField;
            }
            (InField, Some(c)) => self.add(c)?,
            (InQuotedField, None) => {}
            (InQuotedField, Some('"')) => self.state = QuoteInQuotedField,
            (InQuotedField, Some(c)) => self.add(c)?,
            (QuoteInQuotedField, Some('"')) => {
                self.add('"')?;
                self.state = InQuotedField;
            }
            (QuoteInQuotedField, Some(c)) => {
                self.add(c)?;
                self.state = InField;
            }
            (EatCrnl, Some('\n' | '\r')) => {}
            (EatCrnl, None) => self.state = StartRecord,
            // Unreachable with `lines`, which ends a line at every `\r`; kept as in `_csv.c`.
            (EatCrnl, Some(_)) => {
                return Err("new-line character seen in unquoted field - \
                            do you need to open the file with newline=''?"
                    .into());
            }
        }
        Ok(())
    }

    fn add(&mut self, c: char) -> Result<(), String> {
        if self.field_len >= FIELD_LIMIT {
            return Err(format!("field larger than field limit ({FIELD_LIMIT})"));
        }
        self.field.push(c);
        self.field_len += 1;
        Ok(())
    }

    fn save_field(&mut self) {
        self.fields.push(take(&mut self.field));
        self.field_len = 0;
    }
}

/// `text.strip()`: without the whitespace at either end, whitespace as Python counts it
/// (Rust's, and the ASCII separators `\x1c`..=`\x1f`).
pub fn strip(text: &str) -> &str {
    text.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

/// `int(text)` in base 10: surrounding whitespace, an optional sign, digits with single
/// underscores between them (`1_000`), leading zeros allowed. `None` where Python raises
/// `ValueError`, except that Python also takes the other scripts' decimal digits (`٤٢`) and
/// this does not. Whitespace here is Rust's: unlike [`strip`], `int` does not skip the ASCII
/// separators `\x1c`..=`\x1f`. A value outside `i128` saturates at its bound.
pub fn int(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut value: i128 = 0;
    for b in digits.bytes().filter(|&b| b != b'_') {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value
            .saturating_mul(10)
            .saturating_add(i128::from(b - b'0'));
    }
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(text: &str) -> Vec<Vec<String>> {
        csv_records(text).unwrap()
    }

    fn row(fields: &[&str]) -> Vec<String> {
        fields.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn lines_end_at_every_line_ending() {
        let all: Vec<&str> = lines("a\nb\r\nc\rd").collect();
        assert_eq!(all, ["a\n", "b\r\n", "c\r", "d"]);
        assert_eq!(lines("").count(), 0);
        assert_eq!(lines("\r\r\n").collect::<Vec<_>>(), ["\r", "\r\n"]);
    }

    #[test]
    fn plain_records_split_at_commas_and_empty_lines_are_empty_records() {
        assert_eq!(
            records("id,m,a\r\np1, acme ,12\n\n,\n"),
            [
                row(&["id", "m", "a"]),
                row(&["p1", " acme ", "12"]),
                vec![],
                row(&["", ""])
            ]
        );
        assert_eq!(records(""), Vec::<Vec<String>>::new());
        assert_eq!(records("a,b"), [row(&["a", "b"])]);
    }

    #[test]
    fn quoted_fields_hold_commas_quotes_and_line_endings() {
        assert_eq!(
            records("\"a,b\",\"say \"\"hi\"\"\",\"x\ny\"\nnext\n"),
            [row(&["a,b", "say \"hi\"", "x\ny"]), row(&["next"])]
        );
        // Not strict: text after a closing quote goes on unquoted; a quote inside an unquoted
        // field is kept; an open quote at the end of the text ends the field.
        assert_eq!(records("\"ab\"cd,e\"f\n"), [row(&["abcd", "e\"f"])]);
        assert_eq!(records("a,\"open\nend"), [row(&["a", "open\nend"])]);
        assert_eq!(records("a,\""), [row(&["a", ""])]);
    }

    #[test]
    fn a_field_past_the_limit_is_an_error() {
        let at_limit = "x".repeat(FIELD_LIMIT);
        assert_eq!(records(&at_limit), [vec![at_limit.clone()]]);
        assert_eq!(
            csv_records(&format!("{at_limit}x")),
            Err("field larger than field limit (131072)".into())
        );
    }

    #[test]
    fn strip_removes_pythons_whitespace() {
        assert_eq!(strip(" \t\x1c12\u{3000}\n"), "12");
        assert_eq!(strip("\u{feff}1"), "\u{feff}1");
    }

    #[test]
    fn int_reads_what_python_reads() {
        assert_eq!(int("12"), Some(12));
        assert_eq!(int(" +007 "), Some(7));
        assert_eq!(int("-0"), Some(0));
        assert_eq!(int("-15"), Some(-15));
        assert_eq!(int("1_000_0"), Some(10_000));
        for bad in [
            "", "12x", "1.5", "_1", "1_", "1__0", "+", "- 1", "0x10", "1 2", "+-1",
        ] {
            assert_eq!(int(bad), None, "{bad:?}");
        }
        assert_eq!(int("\u{3000}12\n"), Some(12));
        assert_eq!(int("12\x1c"), None);
        assert_eq!(int(&"9".repeat(60)), Some(i128::MAX));
    }
}
