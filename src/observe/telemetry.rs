//! Prometheus metrics over HTTP (`--metrics-addr HOST:PORT` on servers and trainers): `GET
//! /metrics` answers the process's figures in the OpenMetrics text format, encoded by the
//! `prometheus-client` crate (the Prometheus project's Rust client) and served by axum through
//! the bounded listener of `base/http.rs` ([`Exporter`]). A process that listens prints
//! `OAR_METRICS <addr>` on stdout, which launchers collect. What a server and a trainer expose
//! is in `server/telemetry.rs` and `train/telemetry.rs`.
//!
//! Pulled by Prometheus, not pushed: the endpoint runs on a thread with a small tokio runtime of
//! its own, so a scrape never waits on a training step or a table lock longer than reading the
//! counters takes, and a stalled scraper costs training nothing. A [`Sheet`] (counters, gauges,
//! labelled gauges and [`Latency`] histograms) is built afresh on each scrape from the counters
//! the process keeps anyway (a server's `ServerStats`), so the summary, the `Stats` request and
//! the metrics have one source of truth; only the latency histograms, observed where requests are
//! timed, are kept for the metrics alone. The tests read the text with a separate parser
//! (`prometheus-parse`) over a real HTTP client (ureq).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::exposition;

/// What a scrape answers: the text of the process's metrics.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A latency histogram in seconds, 10 us to about 10 s, kept across scrapes, and the total of
/// the durations it was given (what `ServerStats` reports as time spent), kept beside it as
/// `prometheus-client` does not let its histogram's sum be read.
#[derive(Clone)]
pub struct Latency(Histogram, Arc<AtomicU64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new(exponential_buckets(1e-5, 2.0, 21)), Arc::default())
    }
}

impl Latency {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
        self.1.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Seconds of every duration recorded.
    pub fn total_seconds(&self) -> f64 {
        self.1.load(Relaxed) as f64 / 1e9
    }
}

/// One scrape's metrics, all named `oar_...`.
pub struct Sheet(Registry);

impl Default for Sheet {
    fn default() -> Self {
        Sheet(Registry::with_prefix("oar"))
    }
}

impl Sheet {
    /// A counter (exposed as `oar_<name>_total`).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        let c: Counter = Counter::default();
        c.inc_by(value);
        self.0.register(name, clean(help), c);
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let g: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
        g.set(value);
        self.0.register(name, clean(help), g);
    }

    /// The process's HTTP listeners' connection counts ([`crate::base::http::counts`]).
    pub fn http_connections(&mut self) {
        let (idle, turned_away) = crate::base::http::counts();
        self.counter(
            "http_connections_closed_idle",
            "Connections to this process's HTTP ports closed for sending no request within the read timeout.",
            idle,
        );
        self.counter(
            "http_connections_turned_away",
            "Connections to this process's HTTP ports turned away: their address held its share.",
            turned_away,
        );
    }

    /// A gauge per value of one label (`label="value"`).
    pub fn gauges(&mut self, name: &str, help: &str, label: &str, values: &[(String, f64)]) {
        let family = Family::<Vec<(String, String)>, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (v, x) in values {
            family.get_or_create(&vec![(label.to_string(), v.clone())]).set(*x);
        }
        self.0.register(name, clean(help), family);
    }

    /// A counter per set of labels (exposed as `oar_<name>_total{...}`).
    pub fn counters(&mut self, name: &str, help: &str, values: &[(Vec<(String, String)>, u64)]) {
        let family = Family::<Vec<(String, String)>, Counter>::default();
        for (labels, x) in values {
            family.get_or_create(labels).inc_by(*x);
        }
        self.0.register(name, clean(help), family);
    }

    /// Pushes by how many updates behind they arrived, a gauge per count (`behind="k"`).
    pub fn staleness(&mut self, help: &str, s: &crate::observe::metrics::Staleness) {
        let counts: Vec<(String, f64)> = s.0.iter().enumerate().map(|(k, &n)| (k.to_string(), n as f64)).collect();
        self.gauges("pushes_by_staleness", help, "behind", &counts);
    }

    /// A latency histogram, in seconds.
    pub fn latency(&mut self, name: &str, help: &str, h: &Latency) {
        self.0.register_with_unit(name, clean(help), prometheus_client::registry::Unit::Seconds, h.0.clone());
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.0).expect("writing to a String cannot fail");
        out
    }
}

/// Help text as the encoder wants it: without its closing period, which the encoder adds (a
/// period of our own made every help line end in "..").
fn clean(help: &str) -> &str {
    help.trim_end().trim_end_matches('.')
}

/// What scrapers may hold of a metrics endpoint: a few connections (16 from one address), each
/// closed when idle for 10 s (a scrape takes milliseconds; Prometheus reconnects), no request
/// body.
const SCRAPER_LIMITS: crate::base::http::Limits = crate::base::http::Limits {
    connections: 64,
    per_address: 16,
    read_timeout: std::time::Duration::from_secs(10),
    max_body: 0,
    buffered: 0,
};

/// One scrape's answer: the metrics `render` writes (OpenMetrics), in the format the request's
/// `Accept` header asks for ([`exposition::negotiate`]), rendered on the blocking pool.
pub async fn scrape(
    headers: &axum::http::HeaderMap,
    render: impl FnOnce() -> String + Send + 'static,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = exposition::negotiate(accept);
    let body = tokio::task::spawn_blocking(move || exposition::render(render(), format)).await.unwrap_or_default();
    ([(axum::http::header::CONTENT_TYPE, format.content_type())], body)
}

/// A metrics endpoint serving until dropped.
pub struct Exporter {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Listens on `addr` (port 0: any free port) and answers scrapes with `render()`, printing
    /// `OAR_METRICS <addr>` on stdout.
    pub fn start(addr: &str, render: Render) -> anyhow::Result<Exporter> {
        let listener =
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen for metrics on {addr}"))?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("metrics".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let app = axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move |headers: axum::http::HeaderMap| {
                        let render = render.clone();
                        async move { scrape(&headers, move || render()).await }
                    }),
                );
                crate::base::http::serve(listener, app, SCRAPER_LIMITS, async {
                    let _ = stopped.await;
                })
                .await;
            })
        })?;
        tracing::info!(address = %bound, "metrics at http://{bound}/metrics");
        println!("OAR_METRICS {bound}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        Ok(Exporter { addr: bound, stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sheet_renders_counters_gauges_labels_and_histograms() {
        let lat = Latency::default();
        lat.observe(Duration::from_millis(3));
        let mut s = Sheet::default();
        s.counter("pulls", "Pull requests served.", 7);
        s.gauge("rss_bytes", "Resident memory.", 1024.0);
        s.gauges("rows", "Rows per table.", "table", &[("emb".into(), 5.0)]);
        s.latency("pull", "Pull latency.", &lat);
        let text = s.render();
        for want in
            ["oar_pulls_total 7", "oar_rss_bytes 1024.0", "oar_rows{table=\"emb\"} 5.0", "oar_pull_seconds_count 1"]
        {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
