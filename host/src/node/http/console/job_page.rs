//! A job's page: what it does now, its runs as a timeline and a table, its terms, its spec.
//! A pure function of what the handler read, like [`super::pages`].

use std::fmt::Write;

use serde_json::Value;

use super::html::{badge, bytes, esc, short_ms, url_part};
use super::pages::{terms_table, text};
use crate::coord::terms::TermRecord;

/// What a job's page shows.
pub(crate) struct JobPage<'a> {
    /// The job's name.
    pub name: &'a str,
    /// The other members that serve it, when this node does not (empty when it does): its
    /// actions are on their consoles.
    pub served_by: &'a [String],
    /// Its spec, as `GET /v1/jobs/{job}` shows it.
    pub spec: &'a Value,
    /// Its status, as `/v1/status` shows it.
    pub status: &'a Value,
    /// Its runs, newest first, as `GET /v1/jobs/{job}/runs` shows them.
    pub runs: &'a [Value],
    /// Its terms, newest first.
    pub terms: &'a [TermRecord],
    /// The signed-in session's CSRF token.
    pub csrf: Option<&'a str>,
    /// What the last action said.
    pub said: Option<&'a str>,
    /// Redis's clock now is not known here: this node's, for the length of open terms.
    pub now_ms: u64,
}

/// A form that posts `action` for the job (with `period`, if any).
fn action(
    name: &str,
    csrf: &str,
    action: &str,
    period: Option<&str>,
    label: &str,
    id: &str,
) -> String {
    let period = period.map_or_else(String::new, |p| {
        format!(
            "<input type=\"hidden\" name=\"period\" value=\"{}\">",
            esc(p)
        )
    });
    format!(
        "<form method=\"post\" action=\"/ui/jobs/{}/act\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"{action}\">{period}<button type=\"submit\" id=\"{}\">{label}</button></form>",
        url_part(name),
        esc(csrf),
        esc(id)
    )
}

/// Who ran a run's steps: the terms its record lists (node, token, the attempt and step each
/// took it at), or for a record written before they were listed, the terms whose time
/// overlaps the run's.
fn ran_by(r: &Value, terms: &[TermRecord], now_ms: u64) -> String {
    let Some(listed) = r["ran_by"].as_array().filter(|l| !l.is_empty()) else {
        let from = ms_of(&r["started_at"]);
        return terms_between(terms, from, ms_of(&r["finished_at"]), now_ms);
    };
    let several = listed.iter().any(|t| t["attempt"] != listed[0]["attempt"]);
    listed
        .iter()
        .map(|t| {
            let attempt = if several {
                format!("attempt {}, ", text(&t["attempt"]))
            } else {
                String::new()
            };
            format!(
                "{} <span class=\"muted\">#{} ({attempt}from step {})</span>",
                text(&t["node"]),
                text(&t["token"]),
                text(&t["from_step"])
            )
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

/// Which terms overlap `[from, to]` (ms): who ran a run's steps.
fn terms_between(terms: &[TermRecord], from: Option<u64>, to: Option<u64>, now_ms: u64) -> String {
    let (Some(from), to) = (from, to.unwrap_or(now_ms)) else {
        return String::new();
    };
    let ran: Vec<String> = terms
        .iter()
        .rev()
        .filter(|t| t.started_ms <= to && t.ended_ms.unwrap_or(now_ms) >= from)
        .map(|t| format!("{} <span class=\"muted\">#{}</span>", esc(&t.node), t.token))
        .collect();
    ran.join(" → ")
}

/// Tasks shown one by one under a run; the rest are counted.
const TASKS_LISTED: usize = 50;

/// A run's fan-out tasks (as `GET /v1/jobs/{job}/runs` lists them): how many are done, then
/// each task's state, attempt, worker and last error, the first [`TASKS_LISTED`] of them.
fn tasks_list(period: &str, tasks: &[Value]) -> String {
    let done = tasks.iter().filter(|x| x["state"] == "done").count();
    let mut h = format!(
        "<details class=\"tasks\" id=\"tasks-{p}\"><summary id=\"tasks-{p}-summary\">tasks: {done} of {} done</summary><table><thead><tr><th>task</th><th>state</th><th>attempt</th><th>worker</th><th>last error</th></tr></thead><tbody>",
        tasks.len(),
        p = esc(period),
    );
    for t in tasks.iter().take(TASKS_LISTED) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            text(&t["id"]),
            badge(t["state"].as_str().unwrap_or("?")),
            text(&t["attempt"]),
            text(&t["worker"]),
            text(&t["error"]),
        );
    }
    h.push_str("</tbody></table>");
    if tasks.len() > TASKS_LISTED {
        let _ = write!(
            h,
            "<p class=\"muted\">and {} more</p>",
            tasks.len() - TASKS_LISTED
        );
    }
    h.push_str("</details>");
    h
}

fn ms_of(v: &Value) -> Option<u64> {
    let t = chrono::DateTime::parse_from_rfc3339(v.as_str()?).ok()?;
    u64::try_from(t.timestamp_millis()).ok()
}

pub(crate) fn job(p: &JobPage<'_>) -> String {
    let (name, st) = (p.name, p.status);
    let mut h = String::new();
    if let Some(said) = p.said {
        let _ = write!(h, "<p class=\"said\" role=\"status\">{}</p>", esc(said));
    }
    match p.csrf {
        _ if !p.served_by.is_empty() => {
            let _ = write!(
                h,
                "<p class=\"muted\">Not served by this node. Served by: {}; its actions are on their consoles.</p>",
                esc(&p.served_by.join(", "))
            );
        }
        Some(csrf) => {
            let _ = write!(
                h,
                "<div class=\"actions\"><form method=\"post\" action=\"/ui/jobs/{}/act\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"action\" value=\"trigger\"><label>Period <input name=\"period\" id=\"period\" placeholder=\"the current one\"></label> <button type=\"submit\" id=\"trigger\">Trigger</button></form> {} {}</div>",
                url_part(name),
                esc(csrf),
                action(name, csrf, "pause", None, "Pause", "pause"),
                action(name, csrf, "resume", None, "Resume", "resume"),
            );
        }
        None => h.push_str("<p class=\"muted\">Sign in to trigger, re-run, pause or resume.</p>"),
    }
    h.push_str("<section id=\"live\"><h2>Now</h2><dl class=\"facts\">");
    let fact = |h: &mut String, k: &str, v: String| {
        let _ = write!(h, "<dt>{k}</dt><dd>{v}</dd>");
    };
    fact(
        &mut h,
        "role here",
        badge(st["state"].as_str().unwrap_or("?")),
    );
    fact(&mut h, "leader", text(&st["leader"]));
    fact(&mut h, "token", text(&st["token"]));
    fact(
        &mut h,
        "lease left",
        st["lease_ms_left"]
            .as_u64()
            .map(short_ms)
            .unwrap_or_default(),
    );
    fact(
        &mut h,
        "paused",
        if st["paused"] == true {
            badge("paused")
        } else {
            "no".into()
        },
    );
    fact(
        &mut h,
        "next run",
        format!(
            "{} {}",
            text(&st["next_run"]["period"]),
            text(&st["next_run"]["at"])
        ),
    );
    let s = &st["storage"];
    fact(
        &mut h,
        "storage (quota)",
        format!(
            "{} of {}, {} of {} keys",
            bytes(&s["bytes"]),
            bytes(&s["max_bytes"]),
            text(&s["keys"]),
            text(&s["max_keys"])
        ),
    );
    h.push_str("</dl><h2>Runs</h2><div class=\"timeline\" aria-label=\"runs, oldest first\">");
    for r in p.runs.iter().rev() {
        let status = r["status"].as_str().unwrap_or("?");
        for a in r["attempts"].as_array().into_iter().flatten() {
            let _ = write!(
                h,
                "<span class=\"cell small s-{}\" title=\"{} attempt {}: {}\"></span>",
                esc(a["status"].as_str().unwrap_or("?")),
                text(&r["period"]),
                text(&a["attempt"]),
                text(&a["status"])
            );
        }
        let _ = write!(
            h,
            "<span class=\"cell s-{}\" title=\"{} attempt {}: {}\"></span>",
            esc(status),
            text(&r["period"]),
            text(&r["attempt"]),
            esc(status)
        );
    }
    h.push_str("</div><table class=\"runs\"><thead><tr><th>period</th><th>status</th><th>attempts</th><th>steps done</th><th>terms that ran it</th><th>duration</th><th>error</th><th></th></tr></thead><tbody>");
    for r in p.runs {
        let period = r["period"].as_str().unwrap_or_default();
        let status = r["status"].as_str().unwrap_or("?");
        let (from, to) = (
            ms_of(&r["started_at"]),
            ms_of(&r["finished_at"]).or(ms_of(&r["updated_at"])),
        );
        let duration = from
            .zip(to)
            .map(|(f, t)| short_ms(t.saturating_sub(f)))
            .unwrap_or_default();
        let mut attempts = String::new();
        for a in r["attempts"].as_array().into_iter().flatten() {
            let _ = write!(
                attempts,
                "{} <pre>{}</pre>",
                badge(a["status"].as_str().unwrap_or("?")),
                text(&a["error"])
            );
        }
        let tasks = r["tasks"]
            .as_array()
            .map_or_else(String::new, |t| tasks_list(period, t));
        // The guest's own last words in the step that failed or waits, under the error.
        let stderr = r["stderr"].as_str().map_or_else(String::new, |s| {
            format!(
                "<span class=\"muted\">the guest's stderr, last lines:</span><pre class=\"stderr\">{}</pre>",
                esc(s)
            )
        });
        let rerun = match p.csrf {
            // A job only other members serve has its actions on their consoles.
            Some(csrf)
                if p.served_by.is_empty()
                    && matches!(status, "failed" | "cancelled" | "missed" | "skipped") =>
            {
                action(
                    name,
                    csrf,
                    "trigger",
                    Some(period),
                    "Re-run",
                    &format!("rerun-{period}"),
                )
            }
            _ => String::new(),
        };
        let _ = write!(
            h,
            "<tr id=\"run-{}\"><td>{}</td><td>{}{tasks}</td><td>{}{attempts}</td><td>{}</td><td>{}</td><td>{duration}</td><td class=\"wide\"><pre>{}</pre>{stderr}</td><td>{rerun}</td></tr>",
            esc(period),
            esc(period),
            badge(status),
            text(&r["attempt"]),
            text(&r["step"]),
            ran_by(r, p.terms, p.now_ms),
            text(&r["error"]),
        );
    }
    h.push_str("</tbody></table><h2>Leadership</h2>");
    h.push_str(&terms_table(p.terms, p.now_ms));
    h.push_str("</section><h2>Spec</h2>");
    let _ = write!(
        h,
        "<pre class=\"spec\">{}</pre>",
        esc(&serde_json::to_string_pretty(p.spec).unwrap_or_default())
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::terms::TermEnd;
    use serde_json::json;

    fn page(csrf: Option<&str>) -> String {
        page_served(csrf, &[])
    }

    fn page_served(csrf: Option<&str>, served_by: &[String]) -> String {
        let hostile = "<script>x()</script>\"><img src=x onerror=y()>";
        let runs = [json!({
            "period": "2026-01-01", "status": "failed", "attempt": 2, "step": 0,
            "started_at": "2026-12-05T05:53:20Z", "finished_at": "2026-12-05T05:53:22Z",
            "error": hostile,
            "stderr": format!("line one\n{hostile}"),
            "attempts": [{"attempt": 1, "status": "failed", "error": hostile}],
            "tasks": [
                {"id": "part-0", "state": "done", "attempt": 1, "worker": "n2"},
                {"id": "part-1", "state": "failed", "attempt": 3, "worker": "n1", "error": hostile},
            ],
        })];
        let terms = [TermRecord {
            token: 7,
            owner: "n1:x".into(),
            node: "n1".into(),
            started_ms: 1_796_450_000_000,
            ended_ms: Some(1_796_450_001_000),
            end: Some(TermEnd::Crashed),
        }];
        let spec = json!({ "sidecar": hostile });
        let status = json!({ "state": "follower", "leader": "n1", "paused": false });
        job(&JobPage {
            name: "probe",
            served_by,
            spec: &spec,
            status: &status,
            runs: &runs,
            terms: &terms,
            csrf,
            said: Some(hostile),
            now_ms: 1_796_450_002_000,
        })
    }

    #[test]
    fn guest_text_is_escaped_and_actions_need_a_session() {
        let signed = page(Some("c5rf"));
        for raw in ["<script>", "<img", "onerror=y()>"] {
            assert!(!signed.contains(raw), "{raw} unescaped");
        }
        assert!(signed.contains("&lt;script&gt;x()&lt;/script&gt;&quot;&gt;&lt;img"));
        assert!(signed.contains("name=\"csrf\" value=\"c5rf\""));
        // The stderr tail is shown under the error, escaped like it.
        assert!(signed.contains("<pre class=\"stderr\">line one\n&lt;script&gt;x()"));
        assert!(signed.contains(">Re-run</button>"));
        assert!(signed.contains("class=\"badge s-crashed\""));
        let anonymous = page(None);
        assert!(!anonymous.contains("<form"), "a form without a session");
    }

    #[test]
    fn a_run_lists_its_tasks_escaped() {
        let p = page(None);
        assert!(p.contains(">tasks: 1 of 2 done</summary>"), "{p}");
        assert!(p.contains("<td>part-1</td><td><span class=\"badge s-failed\">failed</span></td><td>3</td><td>n1</td><td><pre>&lt;script&gt;"), "{p}");
    }

    #[test]
    fn a_job_served_elsewhere_offers_no_action_even_when_signed_in() {
        let p = page_served(Some("c5rf"), &["n3".to_string()]);
        assert!(p.contains("Not served by this node. Served by: n3;"));
        assert!(
            !p.contains("<form"),
            "an action for a job this node does not serve"
        );
        assert!(!p.contains("c5rf"));
    }

    #[test]
    fn a_run_names_the_terms_its_record_lists() {
        let r = json!({
            "period": "2026-01-01", "status": "done", "attempt": 1, "step": 4,
            "ran_by": [
                {"token": 7, "node": "n1", "attempt": 1, "from_step": 0},
                {"token": 9, "node": "<n2>", "attempt": 1, "from_step": 2},
            ],
        });
        assert_eq!(
            ran_by(&r, &[], 0),
            "n1 <span class=\"muted\">#7 (from step 0)</span> → &lt;n2&gt; <span class=\"muted\">#9 (from step 2)</span>"
        );
    }

    #[test]
    fn a_run_names_the_terms_that_overlap_it() {
        assert!(page(None).contains("n1 <span class=\"muted\">#7</span>"));
    }
}
