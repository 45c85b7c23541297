//! The HTTP API on `--http` (README, "HTTP API"): status, health, metrics, operator actions
//! and run history for the jobs this node serves.
//!
//! The endpoints, their bodies and status codes are listed in one place: README.md, "HTTP API".
//! Health and readiness (`/healthz`, `/readyz`) are in [`health`]; the rest is here.
//!
//! Any node serves any of its jobs, leader or not: requests and the pause flag are Redis
//! inputs the leader reads every round. With a token configured (`--http-token`), every `POST`
//! needs `Authorization: Bearer <token>` (401 otherwise). Errors are JSON `{"error": "…"}`
//! with a 4xx status naming the problem (bad job name, unknown job, bad body or period), or 503
//! when Redis cannot be reached. `GET` endpoints never change state.
//!
//! Length: the routes and their handlers together, so the API's whole surface (and which routes
//! need the token) is read in one file; the health checks are in `health`.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::coord::term_store::{Store, TermHistory, TermStore as _};
use crate::exec::runs;
use crate::exec::spec::{CatchUp, Overlap, validate_job_name};
use crate::node::catalog::{Catalog, JobView};
use crate::node::config::Timing;
use crate::store::keys::JobKeys;

mod console;
mod health;
use health::{healthz, readyz};

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Api {
    /// This node's id.
    pub node: String,
    /// The store: operators' writes (trigger, cancel, pause), the served jobs, every status
    /// and history read; on Redis also its connection for what the seam does not carry yet
    /// (fan-out tasks, the members' figures).
    pub store: Store,
    /// The jobs served (kept current by [`crate::node`]).
    pub jobs: watch::Receiver<Catalog>,
    /// Bearer token required by `POST` endpoints, if set.
    pub token: Option<String>,
    /// Lease timings (health's grace, Redis timeout).
    pub timing: Timing,
    /// The live members, as this node's last registration saw them.
    pub members: watch::Receiver<crate::coord::members::View>,
    /// This node's task worker's figures now (its own member entry shows these, not its last
    /// registration's).
    pub counters: std::sync::Arc<crate::exec::workers::Counters>,
    /// The console's sign-in sessions (see `console::session`).
    pub sessions: console::Sessions,
}

/// An error response: a status and a reason.
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("redis is not available: {e}"),
    )
}

/// The routes.
pub(crate) fn router(api: Api) -> Router {
    let mutating = Router::new()
        .route("/v1/jobs/{job}/runs", post(trigger).get(history))
        .route("/v1/jobs/{job}/runs/{period}/cancel", post(cancel))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), authorize));
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/jobs", get(jobs))
        .route("/v1/jobs/{job}", get(job))
        .route("/v1/jobs/{job}/terms", get(terms))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(mutating)
        .merge(console::routes())
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such endpoint; see README, \"HTTP API\"".into(),
            )
        })
        .with_state(api)
}

/// Serves `api` on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(api))
        .with_graceful_shutdown(shutdown)
        .await
}

/// With a token configured, every `POST` needs `Authorization: Bearer <token>`.
async fn authorize(
    State(api): State<Api>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, ApiError> {
    if request.method() == axum::http::Method::POST
        && let Some(token) = &api.token
    {
        let given = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()));
        if !ok {
            return Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "this endpoint changes state: it needs `Authorization: Bearer <token>` with the node's --http-token".into(),
            ));
        }
    }
    Ok(next.run(request).await)
}

/// Compares without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Api {
    /// The job named in a path: 400 for a bad name, 404 for a job this node does not serve.
    fn job(&self, name: &str) -> Result<JobView, ApiError> {
        validate_job_name(name).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
        self.jobs.borrow().jobs.get(name).cloned().ok_or_else(|| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("job {name:?} is not served by node {}", self.node),
            )
        })
    }
}

/// Body of `POST /v1/jobs/{job}/runs`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    /// The period; default the current period.
    period: Option<String>,
}

async fn trigger(
    State(api): State<Api>,
    Path(name): Path<String>,
    body: Result<Json<TriggerBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    api.job(&name)?;
    let body = match body {
        Ok(Json(b)) => b,
        // An empty body asks for the current period.
        Err(JsonRejection::MissingJsonContentType(_)) => TriggerBody::default(),
        Err(e) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("bad body: {}", e.body_text()),
            ));
        }
    };
    let (done, period) = trigger_period(&api, &name, body.period).await?;
    let status = match done {
        runs::Triggered::Requested | runs::Triggered::Rerun(_) => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    Ok(answered(
        status,
        &name,
        &period,
        done.word(),
        done.describe(&name, &period),
    ))
}

/// Asks for a run of `name`'s `period` (default: the current period), as `POST …/runs` and the
/// console's trigger and re-run do: what the request did, and the period.
async fn trigger_period(
    api: &Api,
    name: &str,
    period: Option<String>,
) -> Result<(runs::Triggered, String), ApiError> {
    let job = api.job(name)?.job;
    let schedule = &job.spec.schedule;
    let keys = JobKeys::new(name);
    let period = match period {
        // A period of an earlier schedule with a run record is carried on or run again.
        Some(p) if schedule.period_by_id(&p).is_none() && has_record(api, &keys, &p).await? => p,
        Some(p) => {
            schedule
                .period_by_id(&p)
                .ok_or_else(|| {
                    ApiError(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "period {p:?} is not a period of {name}'s schedule {:?} ({})",
                            schedule.expr(),
                            schedule.tz()
                        ),
                    )
                })?
                .id
        }
        None => {
            schedule
                .current(chrono::Utc::now())
                .ok_or_else(|| {
                    ApiError(
                        StatusCode::CONFLICT,
                        "the schedule has no current period".into(),
                    )
                })?
                .id
        }
    };
    if let Some(p) = schedule.period_by_id(&period)
        && p.fire.with_timezone(&chrono::Utc) > chrono::Utc::now()
    {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!(
                "period {period:?} of {name} fires at {}, in the future: a period runs at or after its fire time",
                p.fire.to_rfc3339()
            ),
        ));
    }
    // Tried once more after a dropped connection, like a read: a request is idempotent (a
    // second one for the same period is deduplicated; a re-run's fresh id asks for one re-run).
    let done = read_reconnecting(|| {
        let (store, keys, period) = (&api.store, &keys, &period);
        async move { runs::trigger(store, keys, period).await }
    })
    .await?;
    Ok((done, period))
}

/// What an operator's request did, as the trigger and cancel routes answer it.
fn answered(status: StatusCode, job: &str, period: &str, word: &str, message: String) -> Response {
    let body = json!({ "job": job, "period": period, "result": word, "message": message });
    (status, Json(body)).into_response()
}

/// Query of `GET /v1/jobs/{job}/runs`.
#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
}

/// The `limit` a history query asks for; 400 for a query that does not parse.
fn asked_limit(
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Option<usize>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    Ok(q.limit)
}

async fn history(
    State(api): State<Api>,
    Path(name): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    api.job(&name)?;
    let limit = asked_limit(query)?.unwrap_or(100).clamp(1, 10_000);
    let records = run_history(&api, &name, limit).await?;
    Ok(Json(json!({ "job": name, "runs": records })).into_response())
}

/// `name`'s newest `limit` run records as `GET …/runs` shows them (an open run with its tasks).
async fn run_history(
    api: &Api,
    name: &str,
    limit: usize,
) -> Result<Vec<serde_json::Value>, ApiError> {
    let keys = JobKeys::new(name);
    read_reconnecting(|| {
        let keys = &keys;
        async move {
            let mut out = Vec::new();
            for r in runs::history(&api.store, keys, limit).await? {
                // An open run's fan-out tasks (their records go with the run's end).
                let tasks = if r.status.is_final() {
                    Vec::new()
                } else {
                    open_tasks(api, keys, &r.period).await?
                };
                let mut v = serde_json::to_value(&r).expect("a run record serializes");
                if !tasks.is_empty() {
                    v["tasks"] = serde_json::to_value(&tasks).expect("tasks serialize");
                }
                out.push(v);
            }
            Ok(out)
        }
    })
    .await
}

/// The fan-out tasks of `period`'s open run: none on etcd, where tasks are not yet (issue 30).
async fn open_tasks(
    api: &Api,
    keys: &JobKeys,
    period: &str,
) -> anyhow::Result<Vec<crate::exec::tasks::TaskView>> {
    match &api.store {
        Store::Redis(r) => {
            Ok(crate::exec::tasks::tasks_of(&mut r.conn().clone(), keys, period).await?)
        }
        Store::Etcd(_) => Ok(Vec::new()),
    }
}

/// `POST /v1/jobs/{job}/runs/{period}/cancel`: 202 when the leader is asked to cancel the open
/// run, 200 when it is cancelled already, 409 when the period has no open run.
async fn cancel(
    State(api): State<Api>,
    Path((name, period)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    api.job(&name)?;
    runs::validate_period_shape(&period)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    let keys = JobKeys::new(&name);
    // Not retried on a dropped connection: a second cancel would be a second request.
    let done = runs::cancel(&api.store, &keys, &period)
        .await
        .map_err(|e| unavailable(format!("{e:#}")))?;
    let status = match done {
        runs::Cancel::Requested(_) => StatusCode::ACCEPTED,
        runs::Cancel::AlreadyCancelled(_) => StatusCode::OK,
        runs::Cancel::NotOpen(_) | runs::Cancel::NoRun => StatusCode::CONFLICT,
    };
    Ok(answered(
        status,
        &name,
        &period,
        done.word(),
        done.describe(&name, &period),
    ))
}

async fn pause(State(api): State<Api>, Path(name): Path<String>) -> Result<Response, ApiError> {
    set_paused(api, name, true).await
}

async fn resume(State(api): State<Api>, Path(name): Path<String>) -> Result<Response, ApiError> {
    set_paused(api, name, false).await
}

async fn set_paused(api: Api, name: String, paused: bool) -> Result<Response, ApiError> {
    pause_job(&api, &name, paused).await?;
    Ok(Json(json!({ "job": name, "paused": paused })).into_response())
}

/// Sets or clears `name`'s pause flag (the API's and the console's pause and resume).
async fn pause_job(api: &Api, name: &str, paused: bool) -> Result<(), ApiError> {
    api.job(name)?;
    let reason = format!(
        "paused over HTTP on node {} at {}",
        api.node,
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    // Setting or clearing the flag twice is the same as once: tried once more after a dropped
    // connection, like a read.
    let keys = JobKeys::new(name);
    read_reconnecting(|| {
        let (store, keys, reason) = (&api.store, &keys, paused.then_some(reason.as_str()));
        async move { runs::set_paused(store, keys, reason).await }
    })
    .await
}

/// Open runs a job's status shows (the oldest periods first), with their tasks.
const OPEN_RUNS_SHOWN: usize = 5;

/// Runs a read (or an idempotent action) for a request; once more, after a moment, when it
/// failed on a dropped connection: the connection manager reconnects on that error, so the
/// first request after Redis comes back (a restart, a cut) is answered instead of failing with
/// 503.
async fn read_reconnecting<T, F, Fut>(mut read: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    match read().await {
        Ok(v) => Ok(v),
        Err(e) if connection_dropped(&e) => {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            read().await.map_err(|e| unavailable(format!("{e:#}")))
        }
        Err(e) => Err(unavailable(format!("{e:#}"))),
    }
}

/// How long a read waits for the connection manager to reconnect before its second try.
const RECONNECT_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// Whether `e` is Redis's connection having gone away (by its kind, never its text), also
/// inside a run record's read through the store.
fn connection_dropped(e: &anyhow::Error) -> bool {
    let dropped = |r: &redis::RedisError| r.is_connection_dropped() || r.is_connection_refusal();
    e.chain().any(|cause| {
        cause
            .downcast_ref::<redis::RedisError>()
            .is_some_and(dropped)
            || match cause.downcast_ref::<runs::RecordError>() {
                Some(runs::RecordError::Redis(r)) => dropped(r),
                Some(runs::RecordError::Store(inner)) => connection_dropped(inner),
                _ => false,
            }
    })
}

/// Whether `period` has a run record (a period id of the right shape only).
async fn has_record(api: &Api, keys: &JobKeys, period: &str) -> Result<bool, ApiError> {
    if runs::validate_period_shape(period).is_err() {
        return Ok(false);
    }
    let rest = JobKeys::run_rest(period);
    read_reconnecting(|| async { Ok(api.store.read_key(keys.job(), &rest).await?.is_some()) }).await
}

/// The state shown for a job this node does not serve and other live members do.
pub(crate) const ELSEWHERE: &str = "elsewhere";

/// One job's status as this node sees it; for a job it does not serve (`view` is `None`), what
/// Redis has of it (no next run, component or quota: those are in the serving nodes' specs).
async fn job_status(
    api: &Api,
    name: &str,
    view: Option<&JobView>,
) -> Result<serde_json::Value, ApiError> {
    read_reconnecting(|| read_job_status(api, name, view)).await
}

async fn read_job_status(
    api: &Api,
    name: &str,
    view: Option<&JobView>,
) -> anyhow::Result<serde_json::Value> {
    let keys = JobKeys::new(name);
    let status = api.store.job_status(name).await?;
    // The open runs (pending, running, waiting) and, while they have them, their tasks (fan-out
    // tasks are on Redis only yet).
    let mut open_runs = Vec::new();
    for period in status.open.iter().take(OPEN_RUNS_SHOWN) {
        let Some(r) = runs::read_from(&api.store, &keys, period).await? else {
            continue;
        };
        if r.status.is_final() {
            continue;
        }
        let tasks = open_tasks(api, &keys, period).await?;
        open_runs.push(json!({
            "period": r.period, "status": r.status.as_str(), "step": r.step,
            "attempt": r.attempt, "node": r.node,
            "tasks": (!tasks.is_empty()).then(|| crate::exec::tasks::task_counts(&tasks)),
        }));
    }
    let last_run = match &status.last_run {
        Some(period) => runs::read_from(&api.store, &keys, period).await?.map(|r| {
            json!({
                "period": r.period, "status": r.status.as_str(), "attempt": r.attempt,
                "node": r.node, "finished_at": r.finished_at, "error": r.error,
                "earlier_schedule": r.earlier_schedule,
            })
        }),
        None => None,
    };
    let next = view.and_then(|v| v.job.spec.schedule.next(chrono::Utc::now()));
    // The node id is the owner up to its last ':' (owners are `node-id:uuid`).
    let leader = status
        .owner
        .as_deref()
        .map(|o| o.rsplit_once(':').map_or(o, |(n, _)| n).to_string());
    let state = view.map_or(ELSEWHERE, |v| v.role.borrow().name());
    let limits = view.map(|v| v.job.spec.limits);
    Ok(json!({
        "job": name,
        "state": state,
        "leader": leader.clone().unwrap_or_else(|| "no leader".into()),
        "has_leader": leader.is_some(),
        "token": status.token,
        "lease_ms_left": status.left.map(|l| l.as_millis() as u64),
        "paused": status.paused,
        "last_run": last_run,
        "open_runs": open_runs,
        "next_run": next.map(|p| json!({ "period": p.id, "at": p.fire.to_rfc3339() })),
        "component": view.map(|v| v.job.hash.clone()),
        "storage": {
            "keys": status.usage.0,
            "bytes": status.usage.1,
            "max_keys": limits.map(|l| l.stored_keys),
            "max_bytes": limits.map(|l| l.stored_bytes),
        },
    }))
}

fn spec_json(view: &JobView) -> serde_json::Value {
    let spec = &view.job.spec;
    let p = &spec.policies;
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    json!({
        "job": spec.name,
        "file": view.job.path.display().to_string(),
        "component": view.job.hash,
        "sidecar": view.job.sidecar,
        "schedule": spec.schedule.expr(),
        "time_zone": spec.schedule.tz().name(),
        "limits": {
            "memory_bytes": spec.limits.memory,
            "step_ms": ms(spec.limits.step_time),
            "write_bytes": spec.limits.write_bytes,
            "stored_keys": spec.limits.stored_keys,
            "stored_bytes": spec.limits.stored_bytes,
        },
        "world": view.job.world(),
        "policies": {
            "catch_up": match p.catch_up { CatchUp::Latest => "latest", CatchUp::Skip => "skip", CatchUp::All => "all" },
            "catch_up_window_ms": ms(p.catch_up_window),
            "retry_attempts": p.retry_attempts,
            "retry_backoff_ms": ms(p.retry_backoff),
            "retry_max_backoff_ms": ms(p.retry_max_backoff),
            "overlap": match p.overlap { Overlap::Queue => "queue", Overlap::Skip => "skip" },
            "max_run_ms": p.max_run_time.map(ms),
        },
    })
}

async fn status(State(api): State<Api>) -> Result<Response, ApiError> {
    let catalog = api.jobs.borrow().clone();
    let mut jobs = Vec::new();
    for (name, view) in &catalog.jobs {
        jobs.push(job_status(&api, name, Some(view)).await?);
    }
    let refused: Vec<_> = catalog
        .refused
        .iter()
        .map(|r| json!({ "file": r.path.display().to_string(), "reason": r.reason }))
        .collect();
    let compiling: Vec<_> = catalog
        .compiling
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    Ok(Json(json!({
        "node": api.node,
        "members": members_now(&api).await,
        "jobs": jobs,
        "refused": refused,
        "compiling": compiling
    }))
    .into_response())
}

/// The live members as `/v1/status` shows them.
async fn members_now(api: &Api) -> Vec<serde_json::Value> {
    // Each member's figures as it last wrote them, not as this node's last registration read
    // them (a heartbeat older); this node's own worker figures as of now.
    let view = api.members.borrow().members.clone();
    // (On etcd, as the last registration saw them.)
    let fresh = match &api.store {
        Store::Redis(r) => tokio::time::timeout(
            std::time::Duration::from_secs(2),
            crate::coord::members::refreshed(&mut r.conn().clone(), &view),
        )
        .await
        .unwrap_or(view),
        Store::Etcd(_) => view,
    };
    fresh
        .iter()
        .map(|(node, m)| {
            let tasks = if *node == api.node {
                api.counters.snapshot()
            } else {
                m.tasks
            };
            json!({ "node": node, "capacity": m.capacity, "version": m.version, "http": m.http, "since": m.since, "seen": m.seen, "tasks": tasks })
        })
        .collect()
}

async fn jobs(State(api): State<Api>) -> Response {
    let catalog = api.jobs.borrow().clone();
    let jobs: Vec<_> = catalog.jobs.values().map(spec_json).collect();
    Json(json!({ "node": api.node, "jobs": jobs })).into_response()
}

async fn job(State(api): State<Api>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let view = api.job(&name)?;
    let mut body = spec_json(&view);
    body["status"] = job_status(&api, &name, Some(&view)).await?;
    Ok(Json(body).into_response())
}

/// `GET /v1/jobs/{job}/terms`: the job's term history, newest first (`limit`, at most
/// [`crate::coord::terms::KEPT`]).
async fn terms(
    State(api): State<Api>,
    Path(name): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    api.job(&name)?;
    let limit = asked_limit(query)?.unwrap_or(crate::coord::terms::KEPT);
    let TermHistory { terms, unparsed } =
        read_reconnecting(|| api.store.history(&name, limit)).await?;
    Ok(Json(json!({ "job": name, "terms": terms, "unparsed": unparsed })).into_response())
}

async fn metrics() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::encode(),
    )
        .into_response()
}
