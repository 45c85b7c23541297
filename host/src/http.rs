//! The HTTP API on `--http` (README, "HTTP API"): operator actions and run history for the
//! jobs this node serves.
//!
//! | method and path | does |
//! | --- | --- |
//! | `POST /v1/jobs/{job}/runs` | ask for a run now; body `{"period": "…"}` or empty for the current period; deduplicated like `leasehold trigger` |
//! | `GET /v1/jobs/{job}/runs?limit=N` | run records, newest period first |
//! | `POST /v1/jobs/{job}/pause`, `…/resume` | pause or resume the job |
//!
//! Any node serves any of its jobs, leader or not: requests and the pause flag are Redis
//! inputs the leader reads every round. Errors are JSON `{"error": "…"}` with a 4xx status
//! naming the problem (bad job name, unknown job, bad body or period), or 503 when Redis cannot
//! be reached. Read-only endpoints never change state.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use redis::aio::ConnectionManager;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use crate::keys::JobKeys;
use crate::runs;
use crate::runtime::LoadedJob;
use crate::spec::validate_job_name;

/// The jobs this node serves, by name (kept current by [`crate::node`]).
pub type Catalog = watch::Receiver<BTreeMap<String, Arc<LoadedJob>>>;

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    /// This node's id.
    pub node: String,
    /// Redis, with the host's timeouts.
    pub conn: ConnectionManager,
    /// The jobs served.
    pub jobs: Catalog,
}

/// An error response: a status and a reason.
pub struct ApiError(StatusCode, String);

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
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/jobs/{job}/runs", post(trigger).get(history))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such endpoint; see README, \"HTTP API\"".into(),
            )
        })
        .with_state(api)
}

/// Serves `api` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(api))
        .with_graceful_shutdown(shutdown)
        .await
}

impl Api {
    /// The job named in a path: 400 for a bad name, 404 for a job this node does not serve.
    fn job(&self, name: &str) -> Result<Arc<LoadedJob>, ApiError> {
        validate_job_name(name).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
        self.jobs.borrow().get(name).cloned().ok_or_else(|| {
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
    let job = api.job(&name)?;
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
    let schedule = &job.spec.schedule;
    let period = match body.period {
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
    let mut conn = api.conn.clone();
    let done = runs::trigger(&mut conn, &JobKeys::new(&name), &period)
        .await
        .map_err(unavailable)?;
    let status = match done {
        runs::Triggered::Requested | runs::Triggered::Rerun(_) => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    let body = json!({
        "job": name,
        "period": period,
        "result": done.word(),
        "message": done.describe(&name, &period),
    });
    Ok((status, Json(body)).into_response())
}

/// Query of `GET /v1/jobs/{job}/runs`.
#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
}

async fn history(
    State(api): State<Api>,
    Path(name): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    api.job(&name)?;
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let mut conn = api.conn.clone();
    let records = runs::history(&mut conn, &JobKeys::new(&name), limit)
        .await
        .map_err(unavailable)?;
    Ok(Json(json!({ "job": name, "runs": records })).into_response())
}

async fn pause(State(api): State<Api>, Path(name): Path<String>) -> Result<Response, ApiError> {
    set_paused(api, name, true).await
}

async fn resume(State(api): State<Api>, Path(name): Path<String>) -> Result<Response, ApiError> {
    set_paused(api, name, false).await
}

async fn set_paused(api: Api, name: String, paused: bool) -> Result<Response, ApiError> {
    api.job(&name)?;
    let reason = format!(
        "paused over HTTP on node {} at {}",
        api.node,
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    let mut conn = api.conn.clone();
    runs::set_paused(
        &mut conn,
        &JobKeys::new(&name),
        paused.then_some(reason.as_str()),
    )
    .await
    .map_err(unavailable)?;
    Ok(Json(json!({ "job": name, "paused": paused })).into_response())
}
