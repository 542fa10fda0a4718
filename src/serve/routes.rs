//! The HTTP routes of `oar serve`: KServe v2's server and model endpoints, and `/metrics`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::{error, json_body, Server};

/// Every route, over `server`.
pub(super) fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new()
        .route(
            "/v2",
            get(|| async {
                json_body(&json!({ "name": "oar", "version": env!("CARGO_PKG_VERSION"), "extensions": [] }))
            }),
        )
        .route("/v2/health/live", get(|| async { json_body(&json!({ "live": true })) }))
        .route("/metrics", get(metrics))
        .route("/v2/health/ready", get(|| async { json_body(&json!({ "ready": true })) }))
        .route("/v2/models/{name}", get(metadata))
        .route("/v2/models/{name}/ready", get(ready))
        .route("/v2/models/{name}/infer", post(infer))
        .with_state(server)
}

/// `GET /metrics`: the server's counters, as OpenMetrics or Prometheus's classic text as the
/// scraper asks.
async fn metrics(State(s): State<Arc<Server>>, headers: HeaderMap) -> impl IntoResponse {
    crate::observe::telemetry::scrape(&headers, move || s.metrics()).await
}

/// `GET /v2/models/{name}`: the model's inputs and outputs.
async fn metadata(State(s): State<Arc<Server>>, UrlPath(name): UrlPath<String>) -> Response {
    match s.model(&name) {
        Ok(m) => json_body(&s.metadata(&m)).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

/// `GET /v2/models/{name}/ready`.
async fn ready(State(s): State<Arc<Server>>, UrlPath(name): UrlPath<String>) -> Response {
    match s.model(&name) {
        Ok(_) => json_body(&json!({ "name": name, "ready": true })).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

/// `POST /v2/models/{name}/infer`: the body read within its bounds, then scored on the blocking
/// pool in one of the server's turns.
async fn infer(
    State(s): State<Arc<Server>>,
    UrlPath(name): UrlPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let m = match s.model(&name) {
        Ok(m) => m,
        Err(e) => {
            s.refused.fetch_add(1, Ordering::Relaxed);
            return error(StatusCode::NOT_FOUND, e);
        }
    };
    let body = match crate::base::http::read_body(&headers, body, &s.limits, &s.bodies).await {
        Ok(body) => body,
        Err((status, message)) => {
            s.refused.fetch_add(1, Ordering::Relaxed);
            let mut answer = error(status, message);
            if status == StatusCode::SERVICE_UNAVAILABLE {
                // Busy for now, not broken: a client may come back shortly.
                answer.headers_mut().insert(axum::http::header::RETRY_AFTER, 1.into());
            }
            return answer;
        }
    };
    let Ok(turn) = s.scoring.clone().acquire_owned().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
    };
    let s2 = s.clone();
    // The turn (and the body's room) go with the scoring: a client that hangs up
    // drops this handler, not the work, which would otherwise run beyond the bound.
    let scored = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        s2.in_scoring.fetch_add(1, Ordering::Relaxed);
        let answer = s2.infer(&m, &body);
        s2.in_scoring.fetch_sub(1, Ordering::Relaxed);
        answer
    });
    match scored.await {
        Ok(r) => r,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("scoring failed: {e}")),
    }
}
