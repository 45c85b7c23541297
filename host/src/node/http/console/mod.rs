//! The operator console on `--http`: server-rendered pages under `/ui`, built into the binary
//! (no CDN, no fonts, no build step), that show the cluster as Redis has it.
//!
//! * `GET /ui` — the overview: members, a page of jobs ([`pages::PER_PAGE`], filtered by name
//!   and this node's role: only the page's jobs are read from Redis, so it stays quick with
//!   thousands of jobs), refused files, files compiling.
//! * `GET /ui/jobs/{job}` — a job: its runs as a timeline and a table (attempts, steps done,
//!   the terms that ran it, error), its terms, its spec and sidecar, its quota.
//! * `GET /ui/leadership` — each job's recent terms ([`crate::coord::terms`]).
//! * `GET|POST /ui/signin`, `POST /ui/signout`, `POST /ui/jobs/{job}/act` — sign-in and the
//!   actions (trigger, re-run, pause, resume); see [`session`] for the cookie and CSRF model.
//!
//! Pages update without a reload: `assets/console.js` fetches the page again every second and
//! swaps its `#live` section. What the pages show is escaped ([`html`]); [`pages`] renders.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;

use super::{Api, ApiError};
use crate::coord::elector::{Role, owner_node};
use crate::coord::term_store::TermStore;
use crate::coord::terms::KEPT;

mod html;
mod job_page;
mod pages;
mod session;

pub(crate) use session::Sessions;

use html::{Frame, esc, page, url_part, with_headers};
use pages::{Filter, PER_PAGE};

/// Runs a job's page shows.
const RUNS_SHOWN: usize = 60;
/// Terms per job on the leadership page.
const TERMS_SHOWN: usize = 10;

/// The console's routes (merged into the API's router).
pub(crate) fn routes() -> Router<Api> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(overview))
        .route("/ui/leadership", get(leadership))
        .route("/ui/jobs/{job}", get(job))
        .route("/ui/jobs/{job}/act", post(act))
        .route("/ui/signin", get(signin_form).post(signin))
        .route("/ui/signout", post(signout))
        .route("/ui/assets/console.js", get(script))
        .route("/ui/assets/console.css", get(style))
}

fn frame<'a>(api: &'a Api, title: &'a str, tab: &'a str, csrf: Option<&'a str>) -> Frame<'a> {
    Frame {
        node: &api.node,
        title,
        tab,
        csrf,
        can_sign_in: api.token.is_some(),
    }
}

/// An error as a page.
fn error_page(api: &Api, e: ApiError) -> Response {
    let body = format!(
        "<p class=\"error\">{}</p><p><a href=\"/ui\">Overview</a></p>",
        esc(&e.1)
    );
    page(e.0, &frame(api, "Not shown", "", None), &body)
}

/// The live members other than this node and the jobs each serves, as they published them
/// ([`TermStore::served_jobs`]); none when the store does not answer within two seconds (the pages
/// then list this node's own jobs).
async fn served_elsewhere(api: &Api) -> BTreeMap<String, Vec<String>> {
    let read =
        tokio::time::timeout(std::time::Duration::from_secs(2), api.store.served_jobs()).await;
    let mut served = read.ok().and_then(Result::ok).unwrap_or_default();
    served.remove(&api.node);
    served
}

/// The cluster's jobs that pass `f`, by name: this node's own (with its view of each) and those
/// only other live members serve (`None`: [`super::ELSEWHERE`] here); and the jobs each node
/// leads as this node's electors see the leases.
async fn matching(
    api: &Api,
    f: &Filter,
) -> (
    Vec<(String, Option<crate::node::catalog::JobView>)>,
    BTreeMap<String, usize>,
) {
    let others = served_elsewhere(api).await;
    let catalog = api.jobs.borrow().clone();
    let served_here: std::collections::BTreeSet<String> = if others.is_empty() {
        Default::default()
    } else {
        catalog.jobs.keys().cloned().collect()
    };
    let mut led = BTreeMap::new();
    let mut out = Vec::new();
    for (name, view) in catalog.jobs {
        let role = view.role.borrow().clone();
        let leader = match &role {
            Role::Leader(_) => Some(api.node.clone()),
            Role::Follower { leader } => Some(owner_node(leader).to_string()),
            _ => None,
        };
        if let Some(n) = leader {
            *led.entry(n).or_insert(0) += 1;
        }
        if f.admits(&name, role.name()) {
            out.push((name, Some(view)));
        }
    }
    let elsewhere: std::collections::BTreeSet<&String> = others
        .values()
        .flatten()
        .filter(|j| !served_here.contains(*j))
        .collect();
    if !elsewhere.is_empty() {
        out.extend(
            elsewhere
                .into_iter()
                .filter(|j| f.admits(j, super::ELSEWHERE))
                .map(|j| (j.clone(), None)),
        );
        out.sort_by(|a, b| a.0.cmp(&b.0));
    }
    (out, led)
}

/// The page of `jobs` that `f` asks for.
fn page_of<T>(jobs: Vec<T>, f: &Filter) -> Vec<T> {
    let pages = jobs.len().div_ceil(PER_PAGE).max(1);
    let skip = (f.page().min(pages) - 1) * PER_PAGE;
    jobs.into_iter().skip(skip).take(PER_PAGE).collect()
}

async fn overview(State(api): State<Api>, headers: HeaderMap, f: Query<Filter>) -> Response {
    let signed = api.sessions.current(&api.node, &headers);
    let (jobs, led) = matching(&api, &f).await;
    let total = jobs.len();
    let mut shown = Vec::new();
    for (name, view) in page_of(jobs, &f) {
        match super::job_status(&api, &name, view.as_ref()).await {
            Ok(v) => shown.push(v),
            Err(e) => return error_page(&api, e),
        }
    }
    let catalog = api.jobs.borrow().clone();
    let refused: Vec<(String, String)> = catalog
        .refused
        .iter()
        .map(|r| (r.path.display().to_string(), r.reason.clone()))
        .collect();
    let compiling: Vec<String> = catalog
        .compiling
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let members = super::members_now(&api).await;
    let body = pages::overview(&pages::Overview {
        members: &members,
        led: &led,
        jobs: &shown,
        total,
        filter: &f,
        refused: &refused,
        compiling: &compiling,
    });
    let csrf = signed.as_ref().map(|s| s.csrf.as_str());
    page(
        StatusCode::OK,
        &frame(&api, "Overview", "overview", csrf),
        &body,
    )
}

async fn leadership(State(api): State<Api>, headers: HeaderMap, f: Query<Filter>) -> Response {
    let signed = api.sessions.current(&api.node, &headers);
    let (jobs, _) = matching(&api, &f).await;
    let total = jobs.len();
    let mut rows = Vec::new();
    for (name, _) in page_of(jobs, &f) {
        let read = super::read_reconnecting(|| async {
            let read = api.store.history(&name, TERMS_SHOWN).await?;
            Ok((read.terms, read.unparsed))
        })
        .await;
        match read {
            Ok((t, _)) => rows.push((name, t)),
            Err(e) => return error_page(&api, e),
        }
    }
    let body = pages::leadership(&rows, &f, total, now_ms());
    let csrf = signed.as_ref().map(|s| s.csrf.as_str());
    page(
        StatusCode::OK,
        &frame(&api, "Leadership", "leadership", csrf),
        &body,
    )
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// Query of a job's page: what the last action said.
#[derive(Deserialize)]
struct JobQuery {
    said: Option<String>,
}

async fn job(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Query<JobQuery>,
) -> Response {
    let signed = api.sessions.current(&api.node, &headers);
    let shown = async {
        // A job only other members serve has its page here too, from what Redis has of it.
        let (view, served_by) = match api.job(&name) {
            Ok(view) => (Some(view), Vec::new()),
            Err(e) => {
                let by: Vec<String> = served_elsewhere(&api)
                    .await
                    .into_iter()
                    .filter(|(_, jobs)| jobs.contains(&name))
                    .map(|(node, _)| node)
                    .collect();
                if by.is_empty() {
                    return Err(e);
                }
                (None, by)
            }
        };
        let spec = match &view {
            Some(view) => super::spec_json(view),
            None => serde_json::json!({ "job": name, "served_by": served_by }),
        };
        let status = super::job_status(&api, &name, view.as_ref()).await?;
        let runs = super::run_history(&api, &name, RUNS_SHOWN).await?;
        let terms =
            super::read_reconnecting(|| async { Ok(api.store.history(&name, KEPT).await?.terms) })
                .await?;
        Ok::<_, ApiError>((spec, status, runs, terms, served_by))
    };
    let (spec, status, runs, terms, served_by) = match shown.await {
        Ok(v) => v,
        Err(e) => return error_page(&api, e),
    };
    let csrf = signed.as_ref().map(|s| s.csrf.as_str());
    let body = job_page::job(&job_page::JobPage {
        name: &name,
        served_by: &served_by,
        spec: &spec,
        status: &status,
        runs: &runs,
        terms: &terms,
        csrf,
        said: q.said.as_deref(),
        now_ms: now_ms(),
    });
    page(StatusCode::OK, &frame(&api, &name, "", csrf), &body)
}

/// A form that changes state: the session's CSRF token and what to do.
#[derive(Deserialize)]
struct ActForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    period: Option<String>,
}

/// Refuses a state change that does not come from a signed-in session's own form: no session,
/// a missing or wrong CSRF token, or a request another site's page sent (why, in words).
fn check_form(
    api: &Api,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<session::SignedIn, &'static str> {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return Err("a request from another site's page");
    }
    let s = api
        .sessions
        .current(&api.node, headers)
        .ok_or("sign in first")?;
    if !session::same(csrf, &s.csrf) {
        return Err("the form's CSRF token is missing or not this session's");
    }
    Ok(s)
}

/// The page of a refused state change: nothing was changed.
fn refused(api: &Api, why: &str) -> Response {
    let body = format!(
        "<p class=\"error\">Refused: {}; nothing was changed.</p>",
        esc(why)
    );
    page(
        StatusCode::FORBIDDEN,
        &frame(api, "Refused", "", None),
        &body,
    )
}

async fn act(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<ActForm>,
) -> Response {
    if let Err(why) = check_form(&api, &headers, &form.csrf) {
        return refused(&api, why);
    }
    let period = form.period.filter(|p| !p.trim().is_empty());
    let said = match form.action.as_str() {
        "trigger" => super::trigger_period(&api, &name, period)
            .await
            .map(|(done, period)| done.describe(&name, &period)),
        "pause" => super::pause_job(&api, &name, true)
            .await
            .map(|()| format!("{name} is paused: no new runs start until it is resumed")),
        "resume" => super::pause_job(&api, &name, false)
            .await
            .map(|()| format!("{name} is resumed")),
        other => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("no action {other:?}"),
        )),
    };
    let said = match said {
        Ok(s) => s,
        Err(e) if e.0 == StatusCode::NOT_FOUND => return error_page(&api, e),
        Err(e) => format!("refused: {}", e.1),
    };
    Redirect::to(&format!(
        "/ui/jobs/{}?said={}",
        url_part(&name),
        url_part(&said)
    ))
    .into_response()
}

async fn signin_form(State(api): State<Api>) -> Response {
    let body = if api.token.is_some() {
        "<form method=\"post\" action=\"/ui/signin\" class=\"signin\"><label>Token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"current-password\" required></label> <button type=\"submit\" id=\"signin\">Sign in</button></form><p class=\"muted\">The node's --http-token (LEASEHOLD_HTTP_TOKEN). It is sent in this form's body only and kept nowhere.</p>"
    } else {
        "<p>This node has no --http-token: nobody can sign in, and the console is read-only.</p>"
    };
    page(StatusCode::OK, &frame(&api, "Sign in", "", None), body)
}

#[derive(Deserialize)]
struct SignInForm {
    #[serde(default)]
    token: String,
}

async fn signin(State(api): State<Api>, Form(form): Form<SignInForm>) -> Response {
    let Some(token) = &api.token else {
        return signin_form(State(api)).await;
    };
    if !session::same(&form.token, token) {
        let body = "<p class=\"error\">That is not this node's token.</p><p><a href=\"/ui/signin\">Try again</a></p>";
        return page(
            StatusCode::UNAUTHORIZED,
            &frame(&api, "Sign in", "", None),
            body,
        );
    }
    let (_, cookie) = api.sessions.open(&api.node);
    let mut r = Redirect::to("/ui").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

async fn signout(
    State(api): State<Api>,
    headers: HeaderMap,
    Form(form): Form<ActForm>,
) -> Response {
    let s = match check_form(&api, &headers, &form.csrf) {
        Ok(s) => s,
        Err(why) => return refused(&api, why),
    };
    let cookie = api.sessions.close(&api.node, &s.id);
    let mut r = Redirect::to("/ui").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = with_headers(StatusCode::OK, body.to_string());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

async fn script() -> Response {
    asset(
        include_str!("assets/console.js"),
        "text/javascript; charset=utf-8",
    )
}

async fn style() -> Response {
    asset(
        include_str!("assets/console.css"),
        "text/css; charset=utf-8",
    )
}
