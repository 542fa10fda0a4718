//! `oar serve`: online prediction over HTTP with KServe's v2 inference protocol, from a saved
//! model, reloading a newer one when the training job saves it.
//!
//! | route | answer |
//! |---|---|
//! | `GET /v2`, `GET /v2/health/live`, `GET /v2/health/ready` | the server, `{"live": true}`, `{"ready": true}` |
//! | `GET /v2/models/NAME` | name, versions (the saved pass), platform, inputs, outputs |
//! | `GET /v2/models/NAME/ready`, `.../config`, `.../stats` | readiness, Triton's model configuration and statistics (`describe.rs`) |
//! | `POST /v2/models/NAME/infer` | one FP32 `[N, 1]` output per head ([`v2`]), JSON or binary ([`binary`]) |
//! | `POST /v2/repository/index`, `GET /v2/models/stats` | the one model served, its statistics |
//! | `GET /metrics` | Prometheus: requests, samples, refusals, reloads, the served pass, latency |
//!
//! Every model route answers with `/versions/V` too, where V is the pass served (another
//! version is a 404 that names the one served).
//!
//! Scores come from oar's own forward pass ([`crate::serve::predict::Scorer`], the numbers of `oar
//! predict`), on tokio's blocking pool so a long batch never stalls the connections. Only the
//! heads that score are answered, and only the slots they read are needed (`Model::scored_heads`,
//! `Model::scored_slots`): a `value` head is a training loss. A request is scored 4,096 samples at
//! a time, so its activations take what that many do however many samples it holds, and as many
//! requests are parsed and scored at once as there are cores (at least 2). A turn is held by the
//! scoring itself, not by the request's handler, which goes when its client hangs up. Request
//! bodies take room in one budget of bytes (`base::http::Bodies`), waiting or being scored.
//!
//! A watcher polls the model folder (`latest` and the pass's `manifest.json`, which a save writes
//! last); when they change it loads the new pass beside the old one and swaps it in behind an
//! `Arc`: a request holds the model it started with to its end, so none is dropped or mixed. A
//! pass that fails to load (torn, another job's) is reported and the old one kept. Connections
//! are served by the bounded listener of `base/http.rs`.

pub mod binary;
mod describe;
pub mod model_export;
pub mod predict;
mod routes;
pub mod v2;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use parking_lot::{Mutex, RwLock};
use serde_json::json;

use crate::model::Registry;
use crate::serve::predict::{Saved, Scorer};

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The saved model: a training job's output folder (follows its `latest`) or a pass folder.
    pub model: PathBuf,
    /// Where to listen.
    pub addr: String,
    /// The model's name in URLs.
    pub name: String,
    /// How often the model folder is checked for a newer save.
    pub poll: Duration,
    /// What one client may hold: connections, read deadlines, the largest request body.
    pub limits: crate::base::http::Limits,
}

/// A loaded model and what identifies its files.
struct Loaded {
    saved: Saved,
    /// The scored heads' output names (a `value` head, a training loss, is not served).
    names: Vec<String>,
    /// The scored heads' indices among the model's heads.
    heads: Vec<usize>,
    /// Per slot: whether the scored heads need it (asked of every request).
    reads: Vec<bool>,
    stamp: Stamp,
}

/// What changes when a job saves a newer pass: the pass folder `latest` names and its
/// manifest's size and time.
#[derive(Clone, Debug, PartialEq)]
struct Stamp {
    pass_dir: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(dir: &Path) -> anyhow::Result<Stamp> {
    let (_, pass_dir) = crate::persist::checkpoint::Manifest::find(dir)?;
    let meta = std::fs::metadata(pass_dir.join("manifest.json"))
        .with_context(|| format!("{}: no manifest.json", pass_dir.display()))?;
    Ok(Stamp { pass_dir, len: meta.len(), modified: meta.modified().ok() })
}

/// Loads the pass `stamp` names.
fn load(stamp: Stamp, registry: &Registry) -> anyhow::Result<Loaded> {
    let saved = crate::serve::predict::load(&stamp.pass_dir, registry)?;
    let model = &saved.model;
    let heads = model.scored_heads();
    let names = heads.iter().map(|&h| model.score_name(h)).collect();
    let reads = model.scored_slots();
    Ok(Loaded { saved, names, heads, reads, stamp })
}

/// The header that says where an `infer` body's JSON ends when binary tensors follow it.
const INFERENCE_HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// The server's shared state.
struct Server {
    name: String,
    limits: crate::base::http::Limits,
    /// Requests parsed and scored at once (the cores, at least 2): a parsed body takes many
    /// times its size, so the bodies waiting stay bodies. A turn is held by the scoring itself,
    /// which goes on when its client hangs up.
    scoring: Arc<tokio::sync::Semaphore>,
    /// The turns `scoring` has in all.
    turns: usize,
    /// Requests being parsed and scored now.
    in_scoring: AtomicU64,
    /// The room for request bodies waiting or being scored.
    bodies: crate::base::http::Bodies,
    current: RwLock<Arc<Loaded>>,
    scorers: Mutex<Vec<Scorer>>,
    answered: AtomicU64,
    /// The time spent answering the requests of `answered`, in nanoseconds.
    answered_ns: AtomicU64,
    /// When the last request was answered, in milliseconds since the Unix epoch (0: none yet).
    last_answer_ms: AtomicU64,
    samples: AtomicU64,
    refused: AtomicU64,
    reloads: AtomicU64,
    failed_reloads: AtomicU64,
    latency: crate::observe::telemetry::Latency,
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, json_body(&json!({ "error": message.to_string() }))).into_response()
}

fn json_body(v: &impl serde::Serialize) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], serde_json::to_string(v).expect("JSON values serialize"))
}

impl Server {
    /// The model named `name`, at `version` if one is named, or why not (answered 404). Its
    /// one version is the pass it serves, which moves on as the job saves newer ones.
    fn model(&self, name: &str, version: Option<&str>) -> Result<Arc<Loaded>, String> {
        if name != self.name {
            return Err(format!("no model {name:?} (this server serves {:?})", self.name));
        }
        let m = self.current.read().clone();
        let pass = m.saved.manifest.pass;
        match version {
            Some(v) if v != pass.to_string() => Err(format!(
                "model {name:?} has no version {v:?}: this server serves its pass {pass}, the newest its job saved"
            )),
            _ => Ok(m),
        }
    }

    /// The Prometheus text of `GET /metrics`.
    fn metrics(&self) -> String {
        let mut sheet = crate::observe::telemetry::Sheet::default();
        sheet.http_connections();
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        sheet.counter("serve_requests", "Infer requests answered with scores.", n(&self.answered));
        sheet.counter("serve_samples", "Samples scored.", n(&self.samples));
        sheet.counter("serve_refused", "Infer requests refused (a bad request or an unknown model).", n(&self.refused));
        sheet.counter("serve_reloads", "Newer saves swapped in.", n(&self.reloads));
        sheet.counter(
            "serve_failed_reloads",
            "Newer saves that did not load (the old model kept).",
            n(&self.failed_reloads),
        );
        sheet.gauge(
            "serve_model_pass",
            "The served model's saved pass.",
            self.current.read().saved.manifest.pass as f64,
        );
        sheet.gauge(
            "serve_buffered_bytes",
            "Request-body bytes held now, waiting or being scored (at most --max-buffered-mib).",
            self.bodies.held() as f64,
        );
        sheet.gauge(
            "serve_scoring",
            "Infer requests being parsed and scored now, a hung-up client's included (at most serve_scoring_turns).",
            n(&self.in_scoring) as f64,
        );
        sheet.gauge("serve_scoring_turns", "Infer requests parsed and scored at once, at most.", self.turns as f64);
        sheet.latency("serve_request", "Time to score an infer request, parsing included.", &self.latency);
        sheet.render()
    }

    /// Answers one `infer` body (on a blocking thread), counting it; `header_len` is its
    /// `Inference-Header-Content-Length`, if it has binary tensors.
    fn infer(&self, m: &Loaded, body: &[u8], header_len: Option<&str>) -> Response {
        let started = std::time::Instant::now();
        let r = self.score(m, body, header_len);
        let took = started.elapsed();
        if r.status() == StatusCode::OK {
            self.answered.fetch_add(1, Ordering::Relaxed);
            self.latency.observe(took);
            self.answered_ns.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            self.last_answer_ms.store(now.as_millis() as u64, Ordering::Relaxed);
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn score(&self, m: &Loaded, body: &[u8], header_len: Option<&str>) -> Response {
        let bad = |e| error(StatusCode::BAD_REQUEST, e);
        let req = match v2::parse(body, header_len) {
            Ok(r) => r,
            Err(e) => return bad(e),
        };
        // The outputs asked for are checked before the samples are read.
        let wanted = match v2::wanted(&req.head, &m.names) {
            Ok(w) => w,
            Err(e) => return bad(e),
        };
        let batch = match v2::batch(&req, &m.saved.schema, &m.reads) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        let mut scorer = self.scorers.lock().pop().unwrap_or_default();
        let scored = scorer.scores_in_parts(&m.saved, &batch);
        self.scorers.lock().push(scorer);
        let mut all = match scored {
            Ok(all) => all,
            Err(e) => return bad(format!("{e:#}")),
        };
        let scores: Vec<Vec<f32>> = m.heads.iter().map(|&h| std::mem::take(&mut all[h])).collect();
        let id = req.head.id.clone();
        let answer = v2::response(&self.name, m.saved.manifest.pass, id, &m.names, &scores, &wanted);
        self.samples.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let json = (axum::http::header::CONTENT_TYPE, "application/json");
        match answer.header_len {
            None => ([json], answer.body).into_response(),
            Some(n) => {
                let binary = (axum::http::header::CONTENT_TYPE, "application/octet-stream");
                ([binary], [(INFERENCE_HEADER_CONTENT_LENGTH, n.to_string())], answer.body).into_response()
            }
        }
    }

    /// Loads the saved model again whenever its stamp changes; keeps the old one on failure.
    fn watch(self: Arc<Self>, dir: PathBuf, registry: Registry, poll: Duration, stop: std::sync::mpsc::Receiver<()>) {
        let mut failed: Option<Stamp> = None;
        // What made the newest save unreadable, reported once until it changes: a torn
        // manifest, a `latest` naming no pass, the folder gone.
        let mut unreadable: Option<String> = None;
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(poll) {
            let now = match stamp(&dir) {
                Ok(now) => now,
                Err(e) => {
                    let why = format!("{e:#}");
                    if unreadable.as_ref() != Some(&why) {
                        tracing::warn!(
                            "{}: the newest save cannot be read, still serving the old one: {why}",
                            dir.display()
                        );
                        self.failed_reloads.fetch_add(1, Ordering::Relaxed);
                        unreadable = Some(why);
                    }
                    continue;
                }
            };
            unreadable = None;
            if now == self.current.read().stamp || failed.as_ref() == Some(&now) {
                continue;
            }
            match load(now.clone(), &registry) {
                Ok(next) => {
                    let pass = next.saved.manifest.pass;
                    *self.current.write() = Arc::new(next);
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                    failed = None;
                    tracing::info!("serving pass {pass} of {}", dir.display());
                    println!("reloaded: serving model pass {pass}");
                }
                Err(e) => {
                    tracing::warn!("{}: a newer save did not load, still serving the old one: {e:#}", dir.display());
                    self.failed_reloads.fetch_add(1, Ordering::Relaxed);
                    failed = Some(now);
                }
            }
        }
    }
}

impl Server {
    /// A server of `loaded`, scoring as many requests at once as there are cores.
    fn new(config: &ServeConfig, loaded: Loaded) -> Server {
        let turns = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
        Server {
            name: config.name.clone(),
            limits: config.limits,
            current: RwLock::new(Arc::new(loaded)),
            bodies: crate::base::http::Bodies::new(&config.limits),
            scoring: Arc::new(tokio::sync::Semaphore::new(turns)),
            turns,
            in_scoring: AtomicU64::new(0),
            scorers: Mutex::new(Vec::new()),
            answered: AtomicU64::new(0),
            answered_ns: AtomicU64::new(0),
            last_answer_ms: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            failed_reloads: AtomicU64::new(0),
            latency: crate::observe::telemetry::Latency::default(),
        }
    }
}

/// Serves `config.model` until the process is stopped.
pub fn run(config: &ServeConfig, registry: &Registry) -> anyhow::Result<()> {
    v2::check_model_name(&config.name).map_err(anyhow::Error::msg)?;
    let loaded = load(stamp(&config.model)?, registry)?;
    let pass = loaded.saved.manifest.pass;
    let listener =
        std::net::TcpListener::bind(&config.addr).with_context(|| format!("cannot listen on {}", config.addr))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let server = Arc::new(Server::new(config, loaded));
    let (_stop, stopped) = std::sync::mpsc::channel();
    let watcher = {
        let (server, dir, registry, poll) = (server.clone(), config.model.clone(), registry.clone(), config.poll);
        std::thread::Builder::new().name("reload".into()).spawn(move || server.watch(dir, registry, poll, stopped))?
    };
    let app = routes::router(server);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    announce(config, bound, pass);
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        crate::base::http::serve(listener, app, config.limits, std::future::pending()).await;
        anyhow::Ok(())
    });
    drop(_stop);
    let _ = watcher.join();
    served.context("the HTTP server stopped")
}

/// The address line launchers and tests read (`OAR_SERVE`), then one for a person.
fn announce(config: &ServeConfig, bound: std::net::SocketAddr, pass: u32) {
    println!("OAR_SERVE {bound}");
    println!(
        "serving model {:?} pass {pass} of {} at http://{bound}/v2/models/{}",
        config.name,
        config.model.display(),
        config.name
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
