//! `GET /healthz` (is this node's election keeping up?) and `GET /readyz` (has the jobs
//! directory been read, and does Redis answer?).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::Api;
use crate::coord::elector::Role;

/// Jobs this node believes it leads although their lease deadline passed more than `grace`
/// ago: its elector is not keeping up.
pub(crate) fn stuck_leaders(
    roles: &[(String, Role)],
    now: std::time::Instant,
    grace: std::time::Duration,
) -> Vec<String> {
    roles
        .iter()
        .filter_map(|(job, role)| match role {
            Role::Leader(term) => match term.deadline() {
                Some(d) if now > d + grace => Some(format!(
                    "{job}: this node still believes it leads, but its lease deadline passed {} ago without a renewal",
                    crate::node::config::show(now - d)
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

pub(super) async fn healthz(State(api): State<Api>) -> Response {
    let roles: Vec<(String, Role)> = api
        .jobs
        .borrow()
        .jobs
        .iter()
        .map(|(n, v)| (n.clone(), v.role.borrow().clone()))
        .collect();
    let stuck = stuck_leaders(&roles, std::time::Instant::now(), api.timing.heartbeat);
    if stuck.is_empty() {
        Json(json!({ "healthy": true })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "healthy": false, "problems": stuck })),
        )
            .into_response()
    }
}

pub(super) async fn readyz(State(api): State<Api>) -> Response {
    let mut problems = Vec::new();
    let (started, compiling) = {
        let catalog = api.jobs.borrow();
        (catalog.started, catalog.compiling.clone())
    };
    if !started {
        problems.push(if compiling.is_empty() {
            "the jobs directory has not been read yet".to_string()
        } else {
            format!(
                "still compiling {}",
                compiling
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    }
    let ping = tokio::time::timeout(api.timing.redis_timeout, api.store.ping()).await;
    let store = api.store.kind();
    match ping {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("{store}: {e:#}")),
        Err(_) => problems.push(format!(
            "{store} did not answer within {}",
            crate::node::config::show(api.timing.redis_timeout)
        )),
    }
    let compiling: Vec<String> = compiling.iter().map(|p| p.display().to_string()).collect();
    if problems.is_empty() {
        Json(json!({ "ready": true, "compiling": compiling })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ready": false, "problems": problems, "compiling": compiling })),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::stuck_leaders;
    use crate::coord::elector::Role;
    use crate::coord::term::Term;

    #[test]
    fn a_leader_past_its_deadline_by_more_than_the_grace_is_unhealthy() {
        // "Now" is ten seconds ahead, so every deadline below lies after the process's clock
        // base (terms cannot hold deadlines from before the process started).
        let now = Instant::now() + Duration::from_secs(10);
        let fresh = Term::new(1, "n1:a".into(), now + Duration::from_secs(5));
        let late = Term::new(2, "n1:b".into(), now - Duration::from_secs(3));
        let just = Term::new(3, "n1:c".into(), now - Duration::from_millis(100));
        let roles = vec![
            ("fresh".to_string(), Role::Leader(fresh)),
            ("late".to_string(), Role::Leader(late)),
            ("just".to_string(), Role::Leader(just)),
            (
                "follows".to_string(),
                Role::Follower {
                    leader: "n2:x".into(),
                },
            ),
        ];
        let stuck = stuck_leaders(&roles, now, Duration::from_secs(1));
        assert_eq!(stuck.len(), 1, "{stuck:?}");
        assert!(
            stuck[0].starts_with("late: this node still believes it leads"),
            "{stuck:?}"
        );
    }
}
