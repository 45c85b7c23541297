//! The console's pages as HTML, from what the handlers read: pure functions of their inputs, so
//! that what a page shows (and that it escapes) is tested without a server.
//!
//! Each page has one `<section id="live">` that `console.js` replaces with a fresh copy every
//! second; forms that take input (a period to trigger) stay outside it.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use super::html::{at_ms, badge, bytes, esc, short_ms, url_part};
use crate::coord::terms::TermRecord;

/// Jobs per page of the overview and the leadership page.
pub(crate) const PER_PAGE: usize = 50;

/// The overview's and leadership page's filter: a part of the job's name, this node's role,
/// and the page (from 1).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub(crate) struct Filter {
    /// Part of the job name.
    #[serde(default)]
    pub q: String,
    /// This node's role for the job (`leader`, `follower`, `candidate`, or `elsewhere`: served
    /// only by other members), or empty for any.
    #[serde(default)]
    pub role: String,
    /// The page, from 1.
    pub page: Option<usize>,
}

impl Filter {
    /// Whether job `name`, in role `role` here, passes.
    pub(crate) fn admits(&self, name: &str, role: &str) -> bool {
        name.contains(self.q.as_str()) && (self.role.is_empty() || self.role == role)
    }

    /// The page asked for, from 1.
    pub(crate) fn page(&self) -> usize {
        self.page.unwrap_or(1).max(1)
    }

    fn query(&self, page: usize) -> String {
        format!(
            "?q={}&role={}&page={page}",
            url_part(&self.q),
            url_part(&self.role)
        )
    }
}

/// `v` as text (a string's contents, anything else as JSON; nothing for null), escaped.
pub(super) fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => esc(s),
        v => esc(&v.to_string()),
    }
}

fn job_link(name: &str) -> String {
    format!("<a href=\"/ui/jobs/{}\">{}</a>", url_part(name), esc(name))
}

/// The filter form and the pages' links (`total` jobs matched).
fn filter_bar(path: &str, f: &Filter, total: usize) -> String {
    let role = |r: &str, label: &str| {
        let sel = if f.role == r { " selected" } else { "" };
        format!("<option value=\"{r}\"{sel}>{label}</option>")
    };
    let pages = total.div_ceil(PER_PAGE).max(1);
    let page = f.page().min(pages);
    let mut nav = format!("<span class=\"muted\">{total} jobs · page {page} of {pages}</span>");
    if page > 1 {
        let _ = write!(
            nav,
            " <a id=\"prev\" href=\"{path}{}\">← previous</a>",
            f.query(page - 1)
        );
    }
    if page < pages {
        let _ = write!(
            nav,
            " <a id=\"next\" href=\"{path}{}\">next →</a>",
            f.query(page + 1)
        );
    }
    format!(
        "<form method=\"get\" action=\"{path}\" class=\"filter\"><label>Job <input name=\"q\" value=\"{q}\" placeholder=\"part of a name\"></label> <label>Role here <select name=\"role\">{any}{l}{fo}{c}{e}</select></label> <button type=\"submit\">Filter</button></form><p class=\"pages\">{nav}</p>",
        q = esc(&f.q),
        any = role("", "any"),
        l = role("leader", "leader"),
        fo = role("follower", "follower"),
        c = role("candidate", "candidate"),
        e = role(super::super::ELSEWHERE, "served elsewhere"),
    )
}

/// The overview: members, a page of jobs, refused files and files compiling.
pub(crate) struct Overview<'a> {
    /// The live members as `/v1/status` shows them.
    pub members: &'a [Value],
    /// Jobs led per node, as this node's electors see the leases.
    pub led: &'a BTreeMap<String, usize>,
    /// The page's jobs, as `/v1/status` shows each.
    pub jobs: &'a [Value],
    /// How many jobs pass the filter.
    pub total: usize,
    /// The filter.
    pub filter: &'a Filter,
    /// Refused files and why.
    pub refused: &'a [(String, String)],
    /// Files compiling.
    pub compiling: &'a [String],
}

pub(crate) fn overview(o: &Overview<'_>) -> String {
    let mut h = String::new();
    h.push_str(&filter_bar("/ui", o.filter, o.total));
    h.push_str("<section id=\"live\"><h2>Members</h2><table><thead><tr><th>node</th><th>capacity</th><th>version</th><th>jobs led</th><th>task slots in use</th><th>last heartbeat</th></tr></thead><tbody>");
    for m in o.members {
        let node = m["node"].as_str().unwrap_or_default();
        let t = &m["tasks"];
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} of {}</td><td>{}</td></tr>",
            esc(node),
            text(&m["capacity"]),
            text(&m["version"]),
            o.led.get(node).copied().unwrap_or(0),
            text(&t["running"]),
            text(&t["slots"]),
            text(&m["seen"]),
        );
    }
    h.push_str("</tbody></table><h2>Jobs</h2><table><thead><tr><th>job</th><th>role here</th><th>leader</th><th>token</th><th>lease left</th><th>paused</th><th>last run</th><th>next run</th><th>storage</th></tr></thead><tbody>");
    for j in o.jobs {
        let name = j["job"].as_str().unwrap_or_default();
        let last = &j["last_run"];
        let last = if last.is_null() {
            "<span class=\"muted\">none yet</span>".to_string()
        } else {
            format!(
                "{} {}",
                text(&last["period"]),
                badge(last["status"].as_str().unwrap_or("?"))
            )
        };
        let st = &j["storage"];
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{last}</td><td>{} <span class=\"muted\">{}</span></td><td>{} of {}, {} of {} keys</td></tr>",
            job_link(name),
            badge(j["state"].as_str().unwrap_or("?")),
            text(&j["leader"]),
            text(&j["token"]),
            j["lease_ms_left"]
                .as_u64()
                .map(short_ms)
                .unwrap_or_default(),
            if j["paused"] == true {
                badge("paused")
            } else {
                String::new()
            },
            text(&j["next_run"]["period"]),
            text(&j["next_run"]["at"]),
            bytes(&st["bytes"]),
            bytes(&st["max_bytes"]),
            text(&st["keys"]),
            text(&st["max_keys"]),
        );
    }
    h.push_str("</tbody></table>");
    if !o.refused.is_empty() {
        h.push_str(
            "<h2>Refused files</h2><table><thead><tr><th>file</th><th>why</th></tr></thead><tbody>",
        );
        for (file, why) in o.refused {
            let _ = write!(
                h,
                "<tr><td>{}</td><td><pre>{}</pre></td></tr>",
                esc(file),
                esc(why)
            );
        }
        h.push_str("</tbody></table>");
    }
    if !o.compiling.is_empty() {
        h.push_str("<h2>Compiling</h2><ul>");
        for f in o.compiling {
            let _ = write!(h, "<li>{}</li>", esc(f));
        }
        h.push_str("</ul>");
    }
    h.push_str("</section>");
    h
}

/// The terms as a table (newest first).
pub(super) fn terms_table(terms: &[TermRecord], now_ms: u64) -> String {
    let mut h = String::from(
        "<table class=\"terms\"><thead><tr><th>token</th><th>node</th><th>began</th><th>lasted</th><th>ended</th></tr></thead><tbody>",
    );
    for t in terms {
        let lasted = t.ended_ms.unwrap_or(now_ms).saturating_sub(t.started_ms);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.token,
            esc(&t.node),
            at_ms(t.started_ms),
            short_ms(lasted),
            t.end
                .map_or_else(|| badge("leading"), |e| badge(e.as_str())),
        );
    }
    h.push_str("</tbody></table>");
    h
}

/// The leadership page: each job of the page with its recent terms.
pub(crate) fn leadership(
    rows: &[(String, Vec<TermRecord>)],
    f: &Filter,
    total: usize,
    now_ms: u64,
) -> String {
    let mut h = filter_bar("/ui/leadership", f, total);
    h.push_str("<section id=\"live\">");
    for (name, terms) in rows {
        let _ = write!(h, "<h2>{}</h2>", job_link(name));
        if terms.is_empty() {
            h.push_str("<p class=\"muted\">no term recorded yet</p>");
        } else {
            h.push_str(&terms_table(terms, now_ms));
        }
    }
    h.push_str("</section>");
    h
}
