//! A strict CSV reader (RFC 4180): every line of the file is accounted for, or the file is
//! refused naming the line where the problem starts.
//!
//! Lenient readers (the `csv` crate among them) accept what a money-moving job must not: an
//! unclosed quote swallows every later line into one field, and the file is "read" with most of
//! its records missing. This reader takes each edge as follows:
//!
//! | input | taken as |
//! | --- | --- |
//! | a field starting with `"` | quoted: runs to the next lone `"`; `""` inside is one `"`; commas, LF and CRLF inside are text |
//! | a quote that never closes | refused, naming the line where the quote opened |
//! | text after a closing quote (`"ab"c,…`) | refused |
//! | a `"` inside an unquoted field (`ab"c`) | refused: quote the field and double the quote |
//! | line ends | LF or CRLF; a CR not followed by LF (old Mac line ends) is refused, outside quotes and after a closing quote |
//! | a NUL byte | refused (not text) |
//! | blank lines (empty between line ends) | skipped, and counted as lines read |
//! | a missing final line end | fine: the last record ends at the end of the file |
//! | a byte-order mark | the caller strips one at the start of the file; elsewhere it is text |
//!
//! A repeated header line is the entry parser's rule ([`crate::parse_entries`]), not the
//! reader's. The reader counts every physical line it read (header and blank lines included):
//! `wc -l` of a file, plus one when its last line has no line end.

use std::borrow::Cow;

/// Why the text is not well-formed CSV, and the 1-based line where the problem starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvError {
    /// The line where the offending record or quote starts.
    pub line: u64,
    /// What is wrong.
    pub reason: String,
}

/// Reads every record of `text`, calling `record(line, fields)` with the line the record starts
/// on and its fields (as many as the record has: the caller checks the count); stops at the
/// first error, the reader's or the callback's. Returns the number of lines read.
pub fn read_records<'a, E>(
    text: &'a str,
    mut record: impl FnMut(u64, &[Cow<'a, str>]) -> Result<(), E>,
    csv_error: impl Fn(CsvError) -> E,
) -> Result<u64, E> {
    let bytes = text.as_bytes();
    let fail = |line: u64, reason: &str| {
        Err(csv_error(CsvError {
            line,
            reason: reason.to_string(),
        }))
    };
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        let line = 1 + line_breaks(&bytes[..at]);
        return fail(line, "a NUL byte: the file is not text");
    }
    let mut fields: Vec<Cow<'a, str>> = Vec::with_capacity(8);
    let mut pos = 0;
    let mut line: u64 = 1;
    while pos < bytes.len() {
        // A blank line.
        match (bytes[pos], bytes.get(pos + 1)) {
            (b'\n', _) => {
                pos += 1;
                line += 1;
                continue;
            }
            (b'\r', Some(b'\n')) => {
                pos += 2;
                line += 1;
                continue;
            }
            (b'\r', _) => return fail(line, CR_ONLY),
            _ => {}
        }
        let start = line;
        fields.clear();
        loop {
            // One field, then a comma (another field), a line end or the end of the text.
            if bytes.get(pos) == Some(&b'"') {
                let opened = line;
                pos += 1;
                let mut value: Option<String> = None;
                let mut from = pos;
                loop {
                    let Some(q) = bytes[pos..].iter().position(|&b| b == b'"') else {
                        return fail(
                            opened,
                            "a quote opened on this line never closes (a closing quote is missing): every later line would be read as part of one field",
                        );
                    };
                    line += line_breaks(&bytes[pos..pos + q]);
                    let at = pos + q;
                    if bytes.get(at + 1) == Some(&b'"') {
                        // `""`: one quote, and the field goes on.
                        value
                            .get_or_insert_with(String::new)
                            .push_str(&text[from..=at]);
                        pos = at + 2;
                        from = pos;
                        continue;
                    }
                    let field = match value.take() {
                        Some(mut v) => {
                            v.push_str(&text[from..at]);
                            Cow::Owned(v)
                        }
                        None => Cow::Borrowed(&text[from..at]),
                    };
                    fields.push(field);
                    pos = at + 1;
                    break;
                }
                match (bytes.get(pos), bytes.get(pos + 1)) {
                    (None | Some(b'\n'), _) | (Some(b','), _) | (Some(b'\r'), Some(b'\n')) => {}
                    (Some(b'\r'), _) => return fail(line, CR_ONLY),
                    _ => {
                        return fail(
                            line,
                            "text after the closing quote of a field: a quoted field must end at its closing quote (double a quote inside it)",
                        );
                    }
                }
            } else {
                let end = bytes[pos..]
                    .iter()
                    .position(|&b| matches!(b, b',' | b'\n' | b'\r' | b'"'))
                    .map_or(bytes.len(), |n| pos + n);
                match (bytes.get(end), bytes.get(end + 1)) {
                    (Some(b'"'), _) => {
                        return fail(
                            line,
                            "a quote inside an unquoted field: quote the whole field and double the quote",
                        );
                    }
                    (Some(b'\r'), next) if next != Some(&b'\n') => return fail(line, CR_ONLY),
                    _ => {}
                }
                fields.push(Cow::Borrowed(&text[pos..end]));
                pos = end;
            }
            match bytes.get(pos) {
                Some(b',') => pos += 1,
                Some(b'\r') => {
                    pos += 2;
                    line += 1;
                    break;
                }
                Some(b'\n') => {
                    pos += 1;
                    line += 1;
                    break;
                }
                _ => break,
            }
        }
        record(start, &fields)?;
    }
    // The last line counts when it has no line end (and there is a line at all).
    let ends_open = !bytes.is_empty() && !bytes.ends_with(b"\n");
    Ok(line - 1 + u64::from(ends_open))
}

const CR_ONLY: &str = "a carriage return without a line feed: lines must end with LF or CRLF (old Mac line ends are not read)";

/// Line ends in `bytes` (each LF; a CR is part of a CRLF here, lone CRs being refused).
fn line_breaks(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record as owned fields with its line, and the lines read; or the error.
    fn read(text: &str) -> Result<(Vec<(u64, Vec<String>)>, u64), CsvError> {
        let mut out = Vec::new();
        let lines = read_records(
            text,
            |line, fields| {
                out.push((line, fields.iter().map(|f| f.to_string()).collect()));
                Ok(())
            },
            |e| e,
        )?;
        Ok((out, lines))
    }

    fn err(text: &str) -> CsvError {
        read(text).unwrap_err()
    }

    #[test]
    fn well_formed_records_and_their_lines() {
        let (recs, lines) =
            read("a,b\n\"x,1\",\"say \"\"hi\"\"\"\r\n\nc,\"two\nlines\"\nd,").unwrap();
        assert_eq!(
            recs,
            vec![
                (1, vec!["a".into(), "b".into()]),
                (2, vec!["x,1".into(), "say \"hi\"".into()]),
                (4, vec!["c".into(), "two\nlines".into()]),
                (6, vec!["d".into(), "".into()]),
            ]
        );
        // Six lines, the last without a line end.
        assert_eq!(lines, 6);
        assert_eq!(read("").unwrap(), (vec![], 0));
        assert_eq!(read("a\n").unwrap().1, 1);
        assert_eq!(read("a\n\n\n").unwrap().1, 3);
        assert_eq!(read("\"\"").unwrap().0, vec![(1, vec![String::new()])]);
    }

    #[test]
    fn each_malformation_is_refused_at_its_line() {
        // The unclosed quote is named where it opened, not at the end of the file.
        let e = err("a,b\nc,\"open\nd,e\nf,g\n");
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("never closes"), "{e:?}");
        let e = err("a,b\nc,\"ab\"c\n");
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("after the closing quote"), "{e:?}");
        let e = err("a,b\nc,ab\"c\n");
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("quote inside an unquoted field"), "{e:?}");
        for cr in ["a,b\rc,d\r", "a,b\n\rc\n", "a,\"b\"\rc\n"] {
            assert!(err(cr).reason.contains("carriage return"), "{cr:?}");
        }
        let e = err("a,b\nc,d\ne\0,f\n");
        assert_eq!(e.line, 3);
        assert!(e.reason.contains("NUL"), "{e:?}");
        // Inside quotes a CR is text, and lines are counted through the field.
        let (recs, _) = read("\"a\rb\",\"c\r\nd\"\ne,f\n").unwrap();
        assert_eq!(recs[1].0, 3);
        assert_eq!(err("\"x\ny\",1\nz,\"\n").line, 3);
    }

    /// A small xorshift generator: the property test's files are the same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    fn random_field(rng: &mut Rng) -> String {
        const PARTS: [&str; 10] = ["a", "b", "7", " ", ",", "\"", "\n", "\r\n", "\r", "é"];
        (0..rng.below(6))
            .map(|_| PARTS[rng.below(PARTS.len() as u64) as usize])
            .collect()
    }

    fn needs_quotes(f: &str) -> bool {
        f.contains([',', '"', '\n', '\r'])
    }

    /// Serialises `records` with random (valid) choices: quoting where needed and sometimes
    /// where not, LF or CRLF, blank lines, and maybe no final line end.
    fn serialise(rng: &mut Rng, records: &[Vec<String>]) -> String {
        let mut out = String::new();
        for (i, r) in records.iter().enumerate() {
            if rng.chance(10) {
                out.push('\n');
            }
            for (j, f) in r.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                // A record of one empty field would be a blank line: quote it.
                let lone_empty = r.len() == 1 && f.is_empty();
                if needs_quotes(f) || lone_empty || rng.chance(20) {
                    out.push('"');
                    out.push_str(&f.replace('"', "\"\""));
                    out.push('"');
                } else {
                    out.push_str(f);
                }
            }
            let last = i + 1 == records.len();
            if !last || rng.chance(70) {
                out.push_str(if rng.chance(50) { "\n" } else { "\r\n" });
            }
        }
        out
    }

    /// The independent check: `text` is exactly a serialisation of `records` (each field either
    /// verbatim, when it needs no quotes, or quoted with its quotes doubled; fields joined by
    /// commas, records by LF or CRLF with blank lines between). Written in the serialising
    /// direction, apart from the reader.
    fn reproduces(text: &str, records: &[Vec<String>]) -> bool {
        let mut rest = text;
        let skip_blank = |rest: &mut &str| loop {
            if let Some(r) = rest
                .strip_prefix("\r\n")
                .or_else(|| rest.strip_prefix('\n'))
            {
                *rest = r;
            } else {
                return;
            }
        };
        for r in records {
            skip_blank(&mut rest);
            for (j, f) in r.iter().enumerate() {
                if j > 0 {
                    let Some(after) = rest.strip_prefix(',') else {
                        return false;
                    };
                    rest = after;
                }
                let quoted = format!("\"{}\"", f.replace('"', "\"\""));
                if let Some(after) = rest.strip_prefix(quoted.as_str()) {
                    rest = after;
                } else if !needs_quotes(f) && !(r.len() == 1 && f.is_empty()) {
                    let Some(after) = rest.strip_prefix(f.as_str()) else {
                        return false;
                    };
                    rest = after;
                } else {
                    return false;
                }
            }
            match rest
                .strip_prefix("\r\n")
                .or_else(|| rest.strip_prefix('\n'))
            {
                Some(after) => rest = after,
                None if rest.is_empty() => {}
                None => return false,
            }
        }
        skip_blank(&mut rest);
        rest.is_empty()
    }

    fn fields(records: &[(u64, Vec<String>)]) -> Vec<Vec<String>> {
        records.iter().map(|(_, f)| f.clone()).collect()
    }

    /// Property: every generated well-formed file reads back exactly (the same records, every
    /// line counted, and the `csv` crate reads the same records); and a file with one defect
    /// injected is either refused or is, by the independent check, exactly a file of the records
    /// read: never accepted with records missing or merged.
    #[test]
    fn generated_files_read_back_exactly_and_corrupted_ones_are_refused_or_exact() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut refused = 0;
        for _ in 0..4000 {
            let records: Vec<Vec<String>> = (0..rng.below(8))
                .map(|_| {
                    (0..1 + rng.below(5))
                        .map(|_| random_field(&mut rng))
                        .collect()
                })
                .collect();
            let text = serialise(&mut rng, &records);
            let (read_back, lines) = read(&text).unwrap_or_else(|e| panic!("{text:?}: {e:?}"));
            assert_eq!(fields(&read_back), records, "{text:?}");
            let breaks = text.matches('\n').count() as u64;
            let open = !text.is_empty() && !text.ends_with('\n');
            assert_eq!(lines, breaks + u64::from(open), "{text:?}");
            assert!(reproduces(&text, &records), "{text:?}");
            // Another parser agrees on well-formed files.
            let mut other = ::csv::ReaderBuilder::new()
                .has_headers(false)
                .flexible(true)
                .from_reader(text.as_bytes());
            let theirs: Vec<Vec<String>> = other
                .records()
                .map(|r| r.unwrap().iter().map(str::to_string).collect())
                .collect();
            assert_eq!(theirs, records, "{text:?}");
            // One defect: a quote removed, a quote added, or a lone CR or NUL put in.
            let mut bad: Vec<char> = text.chars().collect();
            if bad.is_empty() {
                continue;
            }
            let at = rng.below(bad.len() as u64 + 1) as usize;
            match rng.below(4) {
                0 => match bad.iter().enumerate().filter(|(_, c)| **c == '"').nth(0) {
                    Some(_) => {
                        let quotes: Vec<usize> = bad
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| **c == '"')
                            .map(|(i, _)| i)
                            .collect();
                        let i = quotes[rng.below(quotes.len() as u64) as usize];
                        bad.remove(i);
                    }
                    None => bad.insert(at, '"'),
                },
                1 => bad.insert(at, '"'),
                2 => bad.insert(at, '\r'),
                _ => bad.insert(at, '\0'),
            }
            let bad: String = bad.into_iter().collect();
            match read(&bad) {
                Err(e) => {
                    assert!(e.line >= 1, "{bad:?}: {e:?}");
                    refused += 1;
                }
                Ok((recs, _)) => assert!(
                    reproduces(&bad, &fields(&recs)),
                    "accepted a malformed file as other records: {bad:?} -> {recs:?}"
                ),
            }
        }
        // Most defects make a file malformed; the rest happened to leave it well-formed.
        assert!(
            refused > 2000,
            "only {refused} of the corrupted files refused"
        );
    }

    /// The case an outside check found: an unclosed quote on line 2 of 5 swallowed the rest of
    /// the file into one description, and two entries were "read". Now it is refused, naming
    /// line 2.
    #[test]
    fn an_unclosed_quote_on_line_2_of_5_is_refused_naming_line_2() {
        let text = "id,date,amount,reference,description\n\
                    B1,2026-11-27,1.00,R1,\"unclosed\n\
                    B2,2026-11-27,2.00,R2,two\n\
                    B3,2026-11-27,3.00,R3,three\n\
                    B4,2026-11-27,4.00,R4,four\n";
        let e = err(text);
        assert_eq!(e.line, 2, "{e:?}");
        let e = crate::parse_entries(text, "bank.csv").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(
            e.to_string().starts_with(
                "bank.csv, line 2: malformed CSV: a quote opened on this line never closes"
            ),
            "{e}"
        );
    }
}
