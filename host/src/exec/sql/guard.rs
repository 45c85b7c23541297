//! The statements a guest may not send: [`check`] reads a statement as PostgreSQL's lexer would
//! (string literals, quoted identifiers, dollar quotes and comments skipped) and refuses, before
//! anything is sent, what would end or escape the host's transaction.
//!
//! The database's own means cover the rest (the job's role may not change the fence table, has
//! no `TEMP`, cannot `SET ROLE` to a role it is not a member of; a procedure or `DO` block that
//! commits inside a transaction block fails with `2D000`; the extended protocol refuses two
//! statements in one string). This check exists because they do not cover everything: a plain
//! `COMMIT` sent as one statement ends the transaction, and every later statement would
//! autocommit outside the fence (`../shared/reference/effects-anchors.md`, measured).

/// First keywords refused, and why (upper case).
const REFUSED: &[(&str, &str)] = &[
    (
        "BEGIN",
        "transaction control: the host begins the transaction",
    ),
    (
        "START",
        "transaction control: the host begins the transaction",
    ),
    (
        "COMMIT",
        "transaction control: commit with the transaction's commit",
    ),
    (
        "END",
        "transaction control: commit with the transaction's commit",
    ),
    (
        "ROLLBACK",
        "transaction control: drop the transaction to roll it back",
    ),
    (
        "ABORT",
        "transaction control: drop the transaction to roll it back",
    ),
    (
        "SAVEPOINT",
        "transaction control (savepoints) is the host's",
    ),
    ("RELEASE", "transaction control (savepoints) is the host's"),
    (
        "PREPARE",
        "prepared transactions and statements are the host's",
    ),
    ("EXECUTE", "prepared statements are the host's"),
    ("DEALLOCATE", "prepared statements are the host's"),
    (
        "SET",
        "session and transaction settings (roles, timeouts) are the host's",
    ),
    (
        "RESET",
        "session and transaction settings (roles, timeouts) are the host's",
    ),
    ("DISCARD", "session state is the host's"),
    ("CALL", "a procedure may end the transaction"),
    ("DO", "an anonymous block may end the transaction"),
    (
        "COPY",
        "COPY is not supported: use INSERT … VALUES or INSERT … SELECT",
    ),
    ("LOAD", "loading libraries is not a job's"),
];

/// Why a function that runs SQL given as a string is refused.
const RUNS_SQL: &str = "it runs SQL given as a string, which the host cannot check";
/// Why a way to change settings is refused.
const SETTINGS: &str = "settings (timeouts, roles, search_path) are the host's";

/// Names refused wherever they stand in a statement (lower case), and why: the ways to change a
/// setting without `SET` that PostgreSQL offers every role (a guest that lifts its timeouts and
/// then freezes with its host would hold the fence's row from its successor), the functions
/// that run SQL given as a string (what they run, the guard cannot read), and the fence
/// function, which is the host's. Not airtight: a function the job's role may call or create
/// can do any of it inside (the fence does not rest on this: the database refuses a raise that
/// is not its transaction's first act; the timeouts then rest on the host's own timer, see
/// README).
const REFUSED_NAMES: &[(&str, &str)] = &[
    (
        "set_config",
        "settings (timeouts, roles, search_path) are the host's; pass a value the statement needs as a parameter",
    ),
    ("pg_settings", SETTINGS),
    ("query_to_xml", RUNS_SQL),
    ("query_to_xmlschema", RUNS_SQL),
    ("query_to_xml_and_xmlschema", RUNS_SQL),
    ("ts_stat", RUNS_SQL),
    (
        "raise_fence",
        "the fence is raised by the host, once, at the transaction's start",
    ),
];

/// Objects whose `ALTER … SET` would give the job's role (or its database) default settings:
/// an `ALTER ROLE CURRENT_USER SET standard_conforming_strings = off` would make the database
/// read string literals otherwise than this guard does on every later connection.
const ALTER_REFUSED: &[&str] = &["ROLE", "USER", "GROUP", "DATABASE", "SYSTEM"];

/// Checks one guest statement; the error says what is refused and why.
pub fn check(statement: &str) -> Result<(), String> {
    let code = code_of(statement)?;
    // Several statements: anything but blanks after a `;` (a trailing `;` is allowed).
    let mut parts = code.split(';');
    let first = parts.next().unwrap_or("");
    if parts.any(|p| !p.trim().is_empty()) {
        return Err(
            "several statements in one string: send one statement per call (the host runs each in the job's transaction)"
                .into(),
        );
    }
    let word: String = first
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .chars()
        .take_while(|c| c.is_ascii_alphabetic() || *c == '_')
        .collect::<String>()
        .to_ascii_uppercase();
    if word.is_empty() {
        return Err("the statement is empty".into());
    }
    if let Some((_, why)) = REFUSED.iter().find(|(w, _)| *w == word) {
        return Err(format!("{word} is refused: {why}"));
    }
    if word == "ALTER" {
        let object = first
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_ascii_uppercase();
        if ALTER_REFUSED.contains(&object.as_str()) {
            return Err(format!(
                "ALTER {object} is refused: roles, databases and their default settings are the operator's"
            ));
        }
    }
    let names = first
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$'))
        .map(str::to_lowercase);
    for name in names {
        if let Some((n, why)) = REFUSED_NAMES.iter().find(|(n, _)| *n == name) {
            return Err(format!("{n} is refused: {why}"));
        }
    }
    Ok(())
}

/// The statement with every literal and comment replaced by a space, and every quoted
/// identifier by its name between spaces (its characters other than letters, digits, `_` and
/// `$` as `_`, so a name cannot hide behind quotes and a quoted `;` splits nothing): what is
/// left is keywords, names, numbers and punctuation. An unterminated literal or comment is an
/// error (PostgreSQL would refuse it too), and so is an identifier with Unicode escapes
/// (`U&"…"`), whose name only PostgreSQL would read.
fn code_of(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                out.push(' ');
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // Block comments nest in PostgreSQL.
                let mut depth = 0;
                loop {
                    if i >= b.len() {
                        return Err("unterminated /* comment".into());
                    }
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            b'\'' => {
                // E'…' strings take backslash escapes.
                let escapes = i > 0
                    && (b[i - 1] == b'E' || b[i - 1] == b'e')
                    && (i < 2 || !(b[i - 2].is_ascii_alphanumeric() || b[i - 2] == b'_'));
                i = skip_quoted(b, i, b'\'', escapes).ok_or("unterminated string literal")?;
                out.push(' ');
            }
            b'"' => {
                if i >= 2
                    && b[i - 1] == b'&'
                    && (b[i - 2] == b'U' || b[i - 2] == b'u')
                    && !(i >= 3 && prev_is_ident(b, i - 2))
                {
                    return Err(
                        "identifiers with Unicode escapes (U&\"…\") are refused: write the name plainly"
                            .into(),
                    );
                }
                let end = skip_quoted(b, i, b'"', false).ok_or("unterminated quoted identifier")?;
                out.push(' ');
                out.extend(s[i + 1..end - 1].chars().map(|c| {
                    if c.is_alphanumeric() || c == '_' || c == '$' {
                        c
                    } else {
                        '_'
                    }
                }));
                out.push(' ');
                i = end;
            }
            b'$' if !prev_is_ident(b, i) => {
                // $tag$ … $tag$, or a parameter ($1).
                let tag_end = b[i + 1..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(e)
                        if b[e] == b'$' && !b[i + 1..e].first().is_some_and(u8::is_ascii_digit) =>
                    {
                        let tag = &b[i..=e];
                        let body = e + 1;
                        let close = b[body..]
                            .windows(tag.len())
                            .position(|w| w == tag)
                            .ok_or("unterminated dollar-quoted string")?;
                        i = body + close + tag.len();
                        out.push(' ');
                    }
                    _ => {
                        out.push('$');
                        i += 1;
                    }
                }
            }
            _ => {
                // Copy a whole UTF-8 character.
                let len = utf8_len(c);
                out.push_str(&s[i..(i + len).min(s.len())]);
                i += len;
            }
        }
    }
    Ok(out)
}

/// Whether the byte before `i` continues an identifier (`a$b` is one name, not a dollar quote).
fn prev_is_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] >= 0x80)
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xF7 => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

/// The index after the closing `quote` of the literal opening at `i` (a doubled quote is one
/// quote; with `escapes`, a backslash escapes the next byte); `None` if it never closes.
fn skip_quoted(b: &[u8], mut i: usize, quote: u8, escapes: bool) -> Option<usize> {
    i += 1;
    while i < b.len() {
        if escapes && b[i] == b'\\' {
            i += 2;
            continue;
        }
        if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn statements_that_end_or_escape_the_transaction_are_refused() {
        for bad in [
            "COMMIT",
            "commit and chain",
            "  COMMIT;",
            "/* hi */ COMMIT",
            "-- note\nEND",
            "ROLLBACK",
            "abort",
            "BEGIN",
            "START TRANSACTION",
            "SAVEPOINT a",
            "RELEASE SAVEPOINT a",
            "PREPARE TRANSACTION 'x'",
            "SET ROLE postgres",
            "set local statement_timeout = 0",
            "RESET ROLE",
            "SET SESSION AUTHORIZATION postgres",
            "DO $$ BEGIN COMMIT; END $$",
            "CALL p()",
            "DISCARD ALL",
            "SELECT set_config('statement_timeout', '0', true)",
            "SELECT pg_catalog.SET_CONFIG('idle_in_transaction_session_timeout', '0', false)",
            "SELECT \"set_config\"('statement_timeout', '0', true)",
            "SELECT 1 FROM t WHERE set_config(a, b, true) IS NULL",
            "UPDATE pg_settings SET setting = '0' WHERE name = 'statement_timeout'",
            "SELECT leasehold.raise_fence('other', 9007199254740991, 'x')",
            "SELECT * FROM \"leasehold\".\"raise_fence\"('other', 1, 'x')",
            "SELECT U&\"set\\005fconfig\"('statement_timeout', '0', true)",
            "SELECT u&\"x\" FROM t",
            "SELECT query_to_xml('SELECT set_config(''a'', ''b'', true)', false, false, '')",
            "SELECT * FROM ts_stat('SELECT 1')",
            "ALTER ROLE CURRENT_USER SET standard_conforming_strings = off",
            "alter  user lh_jobs SET statement_timeout = 0",
            "ALTER DATABASE postgres SET search_path = x",
            "INSERT INTO t VALUES (1); COMMIT",
            "SELECT 1; SELECT 2",
            "SELECT 'a'; DELETE FROM t",
            "",
            "  ;",
        ] {
            assert!(check(bad).is_err(), "{bad:?} was allowed");
        }
    }

    #[test]
    fn ordinary_statements_pass_whatever_their_literals_hold() {
        for ok in [
            "SELECT 1",
            "select 1;",
            "INSERT INTO t (a) VALUES ('COMMIT; ROLLBACK')",
            "INSERT INTO t (a) VALUES ($1) ON CONFLICT DO NOTHING",
            "SELECT $body$ ; COMMIT $body$",
            "SELECT \"weird;name\" FROM t",
            "UPDATE t SET a = E'it\\'s; fine' WHERE id = $2",
            "SELECT 1 /* ; COMMIT */",
            "SELECT 1 -- ; COMMIT",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "(SELECT 1)",
            "SELECT a$b FROM t",
            "SELECT 'set_config(1)', \"settings\" FROM t",
            "SELECT current_setting('statement_timeout')",
            "SELECT \"Total;\" FROM \"my table\"",
            "SELECT menu&\"x\" FROM t",
            "ALTER TABLE t ADD COLUMN c int",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn unterminated_literals_are_refused() {
        assert!(check("SELECT 'a").is_err());
        assert!(check("SELECT $x$ a").is_err());
        assert!(check("SELECT 1 /* a").is_err());
        assert!(check("SELECT \"a").is_err());
    }
}
