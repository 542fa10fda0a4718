//! A server's Prometheus metrics (`--metrics-addr`): its counters as `ServerStats` has them,
//! rows, row lifecycle events and memory, push staleness, pull and push latency, the age of its
//! last background checkpoint and its restarts, rendered on each scrape ([`crate::observe::telemetry`]).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use parking_lot::Mutex;

use super::State;
use crate::observe::telemetry::{Latency, Sheet};

/// What only the metrics need: request latencies and when the last checkpoint was written.
#[derive(Default)]
pub(super) struct Telemetry {
    pub(super) pull: Latency,
    pub(super) push: Latency,
    pub(super) last_checkpoint: Mutex<Option<Instant>>,
}

/// The server's metrics now.
pub(super) fn render(state: &State) -> String {
    let s = state.stats();
    let mut m = Sheet::default();
    m.http_connections();
    m.counter("updates", "Updates applied (sync: steps; async: pushes).", s.version);
    m.counter("pulls", "Pull requests served.", s.pulls);
    m.counter("pushes", "Push requests received.", s.pushes);
    m.counter("keys_pulled", "Sparse keys pulled.", s.keys_pulled);
    m.counter("keys_pushed", "Sparse keys pushed.", s.keys_pushed);
    m.counter("push_bytes", "Gradient bytes received in pushes.", s.push_bytes);
    m.counter("discarded_pushes", "Async pushes discarded as too stale.", s.discarded);
    m.counter("repeated_pushes", "Pushes sent again and answered without applying them twice.", s.repeats);
    m.counter(
        "applied_samples",
        "Samples whose gradients were applied, every trainer.",
        s.applied_samples.iter().sum(),
    );
    m.counter(
        "nonfinite_pushes",
        "Pushes refused for a NaN, an infinity or a value beyond ±1e18 (skipped: each step once).",
        s.nonfinite.iter().sum(),
    );
    let names = state.tables(|t| t.spec().name.clone());
    let per_table =
        |v: &[usize]| -> Vec<(String, f64)> { names.iter().cloned().zip(v.iter().map(|&x| x as f64)).collect() };
    m.gauges("rows", "Rows held per sparse table.", "table", &per_table(&s.rows));
    m.gauges("filter_bytes", "Bytes of each table's admission filter.", "table", &per_table(&s.filter_bytes));
    let events: Vec<(Vec<(String, String)>, u64)> = names
        .iter()
        .zip(&s.lifecycle)
        .flat_map(|(table, life)| {
            life.events()
                .map(move |(event, n)| (vec![("table".into(), table.clone()), ("event".into(), event.into())], n))
        })
        .collect();
    m.counters(
        "row_events",
        "What the rows of each sparse table went through: ids admitted, pushes filtered (not admitted yet), rows \
         evicted for the capacity, ids left without room, rows shrunk for a low score or for being unseen, pending \
         ids the admission filter forgot.",
        &events,
    );
    m.gauge("resident_memory_bytes", "The process's resident memory.", s.rss_bytes as f64);
    m.gauge("peak_resident_memory_bytes", "The process's peak resident memory.", s.peak_rss_bytes as f64);
    m.gauge("connections", "Connections open now.", state.open.load(Relaxed) as f64);
    m.staleness("Async pushes by how many updates behind they arrived.", &s.staleness);
    m.gauge("restarts", "Times this server was restarted (its epoch).", state.config.epoch as f64);
    let age = state.telemetry.last_checkpoint.lock().map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
    m.gauge("checkpoint_age_seconds", "Seconds since the last background checkpoint (NaN: none yet).", age);
    m.latency("pull", "Time to serve a pull.", &state.telemetry.pull);
    m.latency("push", "Time to handle a push (a sync step: until it is applied).", &state.telemetry.push);
    m.render()
}
