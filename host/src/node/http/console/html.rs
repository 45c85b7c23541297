//! HTML for the console: escaping, the page frame and its headers.
//!
//! **Everything from a guest or a file is text.** Error messages, periods, sidecar contents,
//! file names and refusal reasons are written only through [`esc`], which replaces the five
//! characters that can end a text node or an attribute value (`& < > " '`). Job and node names
//! are validated, and escaped all the same. The page carries no inline script or style: the
//! `Content-Security-Policy` header ([`SECURITY_HEADERS`]) allows scripts and styles from the
//! console's own two assets only, so markup that did slip through could not run.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `s` as HTML text, safe in element content and in quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` as one URL path segment or query value (RFC 3986 unreserved characters kept).
pub(crate) fn url_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The console's headers on every page: scripts, styles and requests from the console itself
/// only, no framing, no referrer, no caching, no content sniffing.
pub(crate) const SECURITY_HEADERS: [(header::HeaderName, &str); 6] = [
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::CACHE_CONTROL, "no-store"),
    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
];

/// What the frame shows about the visitor.
pub(crate) struct Frame<'a> {
    /// This node's id.
    pub node: &'a str,
    /// The page's title (plain text).
    pub title: &'a str,
    /// Which tab is current (`overview`, `leadership`, or none for a job).
    pub tab: &'a str,
    /// The session's CSRF token when signed in.
    pub csrf: Option<&'a str>,
    /// Whether the node has a token to sign in with.
    pub can_sign_in: bool,
}

/// A whole page: the frame around `body` (already HTML), with the security headers.
pub(crate) fn page(status: StatusCode, f: &Frame<'_>, body: &str) -> Response {
    let tab = |name: &str, href: &str, label: &str| {
        let current = if f.tab == name {
            " aria-current=\"page\""
        } else {
            ""
        };
        format!("<a href=\"{href}\"{current}>{label}</a>")
    };
    let session = match (f.csrf, f.can_sign_in) {
        (Some(csrf), _) => format!(
            "<form method=\"post\" action=\"/ui/signout\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><span class=\"who\">signed in</span> <button type=\"submit\">Sign out</button></form>",
            esc(csrf)
        ),
        (None, true) => {
            "<a href=\"/ui/signin\">Sign in</a> <span class=\"muted\">(read-only until then)</span>"
                .into()
        }
        (None, false) => {
            "<span class=\"muted\">read-only: this node has no --http-token to sign in with</span>"
                .into()
        }
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{title} · Leasehold · {node}</title><link rel=\"stylesheet\" href=\"/ui/assets/console.css\"><script src=\"/ui/assets/console.js\" defer></script></head><body><header><span class=\"brand\">Leasehold</span><nav>{o}{l}</nav><span class=\"node\">node <b>{node}</b></span><span class=\"session\">{session}</span></header><main><h1>{title}</h1>{body}</main></body></html>\n",
        title = esc(f.title),
        node = esc(f.node),
        o = tab("overview", "/ui", "Overview"),
        l = tab("leadership", "/ui/leadership", "Leadership"),
    );
    with_headers(status, html)
}

/// `body` with the security headers.
pub(crate) fn with_headers(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    for (name, value) in SECURITY_HEADERS {
        r.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    r
}

/// A status word as a badge whose colour its class gives (`s-done`, `s-failed`…).
pub(crate) fn badge(word: &str) -> String {
    let class: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("<span class=\"badge s-{class}\">{}</span>", esc(word))
}

/// Milliseconds as a short duration (`1.2s`, `3m 4s`, `2h 5m`).
pub(crate) fn short_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 if ms < 10_000 => format!("{:.1}s", ms as f64 / 1000.0),
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// A byte count for people (`90 B`, `1.5 KiB`, `256 MiB`); nothing for null.
pub(crate) fn bytes(v: &serde_json::Value) -> String {
    let Some(n) = v.as_u64() else {
        return String::new();
    };
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut x, mut u) = (n as f64, 0);
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 || x.fract() == 0.0 {
        format!("{x:.0} {}", units[u])
    } else {
        format!("{x:.1} {}", units[u])
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC, to the second.
pub(crate) fn at_ms(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_is_escaped_everywhere_it_can_land() {
        let hostile = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>'&";
        let e = esc(hostile);
        assert!(!e.contains('<') && !e.contains('>') && !e.contains('"') && !e.contains('\''));
        assert_eq!(esc("a&b"), "a&amp;b");
        assert_eq!(url_part("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(
            badge("done\"><x"),
            "<span class=\"badge s-donex\">done&quot;&gt;&lt;x</span>"
        );
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(short_ms(1234), "1.2s");
        assert_eq!(short_ms(42_000), "42s");
        assert_eq!(short_ms(125_000), "2m 5s");
        assert_eq!(short_ms(7_500_000), "2h 5m");
        assert_eq!(bytes(&serde_json::json!(90)), "90 B");
        assert_eq!(bytes(&serde_json::json!(1536)), "1.5 KiB");
        assert_eq!(bytes(&serde_json::json!(268_435_456)), "256 MiB");
        assert_eq!(bytes(&serde_json::Value::Null), "");
    }
}
