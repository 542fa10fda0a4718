//! The HTTP routes of `oar serve`: KServe v2's server and model endpoints (each model route with
//! and without `/versions/V`), Triton's configuration, statistics and repository-index extensions,
//! and `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};

use super::{describe, error, json_body, Loaded, Server, INFERENCE_HEADER_CONTENT_LENGTH};

/// Every route, over `server`. A model's routes answer with and without `/versions/V`.
pub(super) fn router(server: Arc<Server>) -> axum::Router {
    let model = axum::Router::new()
        .route("/", get(metadata))
        .route("/ready", get(ready))
        .route("/config", get(config))
        .route("/stats", get(stats))
        .route("/infer", post(infer));
    axum::Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { json_body(&json!({ "live": true })) }))
        .route("/v2/health/ready", get(|| async { json_body(&json!({ "ready": true })) }))
        .route("/metrics", get(metrics))
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/repository/index", post(index))
        .nest("/v2/models/{name}/versions/{version}", model.clone())
        .nest("/v2/models/{name}", model)
        .fallback(no_route)
        .with_state(server)
}

/// The model a route names: `{name}`, and `{version}` when the route has one.
type ModelPath = UrlPath<HashMap<String, String>>;

/// The model `path` names, or why not (answered 404).
fn find(s: &Server, path: &HashMap<String, String>) -> Result<Arc<Loaded>, String> {
    let name = path.get("name").map_or("", String::as_str);
    s.model(name, path.get("version").map(String::as_str))
}

/// `describe`'s JSON of the model `path` names, or a 404 that says why not.
fn describe_model(s: &Server, path: &HashMap<String, String>, describe: impl FnOnce(&Loaded) -> Value) -> Response {
    match find(s, path) {
        Ok(m) => json_body(&describe(&m)).into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

/// `GET /v2`: the server's name, version and the protocol extensions it speaks.
async fn server_metadata() -> impl IntoResponse {
    let extensions = ["binary_tensor_data", "model_configuration", "statistics"];
    json_body(&json!({ "name": "oar", "version": env!("CARGO_PKG_VERSION"), "extensions": extensions }))
}

/// Any other route: a 404 that names the routes there are, rather than an empty one.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let routes = "GET /v2, /v2/health/{live,ready}, /v2/models/NAME[/versions/V][/ready|/config|/stats], \
                  /v2/models/stats, /metrics; POST /v2/models/NAME[/versions/V]/infer, /v2/repository/index";
    error(StatusCode::NOT_FOUND, format!("no route {method} {}: oar serve answers {routes}", uri.path()))
}

/// `GET /metrics`: the server's counters, as OpenMetrics or Prometheus's classic text as the
/// scraper asks.
async fn metrics(State(s): State<Arc<Server>>, headers: HeaderMap) -> impl IntoResponse {
    crate::observe::telemetry::scrape(&headers, move || s.metrics()).await
}

/// `GET /v2/models/{name}[/versions/{version}]`: the model's inputs and outputs.
async fn metadata(State(s): State<Arc<Server>>, UrlPath(path): ModelPath) -> Response {
    describe_model(&s, &path, |m| describe::metadata(&s.name, m))
}

/// `GET .../ready`.
async fn ready(State(s): State<Arc<Server>>, UrlPath(path): ModelPath) -> Response {
    describe_model(&s, &path, |_| json!({ "name": s.name, "ready": true }))
}

/// `GET .../config`: the model configuration.
async fn config(State(s): State<Arc<Server>>, UrlPath(path): ModelPath) -> Response {
    describe_model(&s, &path, |m| describe::config(&s.name, m))
}

/// `GET .../stats`: the model's statistics.
async fn stats(State(s): State<Arc<Server>>, UrlPath(path): ModelPath) -> Response {
    describe_model(&s, &path, |m| describe::stats(&s, m))
}

/// `GET /v2/models/stats`: every model's statistics (this server's one).
async fn all_stats(State(s): State<Arc<Server>>) -> Response {
    let m = s.current.read().clone();
    json_body(&describe::stats(&s, &m)).into_response()
}

/// `POST /v2/repository/index`: the model this server serves.
async fn index(State(s): State<Arc<Server>>) -> Response {
    let m = s.current.read().clone();
    json_body(&describe::index(&s.name, &m)).into_response()
}

/// `POST .../infer`: the body read within its bounds, then scored on the blocking pool in one
/// of the server's turns.
async fn infer(State(s): State<Arc<Server>>, UrlPath(path): ModelPath, headers: HeaderMap, body: Body) -> Response {
    let m = match find(&s, &path) {
        Ok(m) => m,
        Err(e) => {
            s.refused.fetch_add(1, Ordering::Relaxed);
            return error(StatusCode::NOT_FOUND, e);
        }
    };
    if let Some(refusal) = unreadable(&headers) {
        s.refused.fetch_add(1, Ordering::Relaxed);
        return refusal;
    }
    // Where the JSON ends is said once: a second, other length was ignored without a word.
    if headers.get_all(INFERENCE_HEADER_CONTENT_LENGTH).iter().count() > 1 {
        s.refused.fetch_add(1, Ordering::Relaxed);
        let message = format!("the {INFERENCE_HEADER_CONTENT_LENGTH} header comes more than once");
        return error(StatusCode::BAD_REQUEST, message);
    }
    let header_len = headers.get(INFERENCE_HEADER_CONTENT_LENGTH).map(|v| v.to_str().unwrap_or("?").to_string());
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
        let answer = s2.infer(&m, &body, header_len.as_deref());
        s2.in_scoring.fetch_sub(1, Ordering::Relaxed);
        answer
    });
    match scored.await {
        Ok(r) => r,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("scoring failed: {e}")),
    }
}

/// A body oar cannot read: compressed (`Content-Encoding` other than `identity`), answered 415
/// before a byte of it is read.
fn unreadable(headers: &HeaderMap) -> Option<Response> {
    let encoding = headers.get(axum::http::header::CONTENT_ENCODING)?;
    if encoding.as_bytes().eq_ignore_ascii_case(b"identity") {
        return None;
    }
    let message = format!("Content-Encoding {encoding:?}: oar serve reads uncompressed request bodies only");
    Some(error(StatusCode::UNSUPPORTED_MEDIA_TYPE, message))
}
