//! A trainer's Prometheus metrics (`--metrics-addr`): samples and steps, the loss and AUC of its
//! latest curve window and pass, pull and push latency, push staleness and memory, updated by
//! the training loop and rendered on each scrape ([`crate::observe::telemetry`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::observe::metrics::Staleness;
use crate::observe::telemetry::{Latency, Sheet};

/// What the training loop reports to the metrics endpoint.
#[derive(Default)]
pub struct TrainerTelemetry {
    trainer: u64,
    pub(super) samples: AtomicU64,
    pub(super) steps: AtomicU64,
    pub(super) pass: AtomicU64,
    /// f64 bits of the latest window's loss and AUC (NaN until measured).
    pub(super) loss: AtomicU64,
    pub(super) auc: AtomicU64,
    pub(super) pass_loss: AtomicU64,
    pub(super) pass_auc: AtomicU64,
    pub(super) pull: Latency,
    pub(super) push: Latency,
    pub(super) staleness: Mutex<Staleness>,
}

impl TrainerTelemetry {
    /// Nothing measured yet, for trainer `trainer`.
    pub fn new(trainer: usize) -> TrainerTelemetry {
        let nan = || AtomicU64::new(f64::NAN.to_bits());
        TrainerTelemetry {
            trainer: trainer as u64,
            loss: nan(),
            auc: nan(),
            pass_loss: nan(),
            pass_auc: nan(),
            ..TrainerTelemetry::default()
        }
    }

    /// The latest window's loss and AUC.
    pub(super) fn window(&self, loss: Option<f64>, auc: Option<f64>) {
        self.loss.store(loss.unwrap_or(f64::NAN).to_bits(), Relaxed);
        self.auc.store(auc.unwrap_or(f64::NAN).to_bits(), Relaxed);
    }

    /// The metrics now.
    pub fn render(&self) -> String {
        let f = |a: &AtomicU64| f64::from_bits(a.load(Relaxed));
        let mut m = Sheet::default();
        m.http_connections();
        m.gauge("trainer", "This trainer's id.", self.trainer as f64);
        m.counter("trained_samples", "Samples trained on in this run.", self.samples.load(Relaxed));
        m.counter("steps", "Steps taken (the trainer's step number).", self.steps.load(Relaxed));
        m.gauge("pass", "The pass being trained.", self.pass.load(Relaxed) as f64);
        m.gauge("loss", "Mean loss of the latest curve window (metrics_every steps).", f(&self.loss));
        m.gauge("auc", "AUC of the latest curve window (log-loss models).", f(&self.auc));
        m.gauge("pass_loss", "Mean training loss of the last finished pass.", f(&self.pass_loss));
        m.gauge("pass_auc", "Training AUC of the last finished pass.", f(&self.pass_auc));
        let (rss, peak) = crate::observe::metrics::process_memory();
        m.gauge("resident_memory_bytes", "The process's resident memory.", rss as f64);
        m.gauge("peak_resident_memory_bytes", "The process's peak resident memory.", peak as f64);
        m.staleness("Pushes by how many updates behind they arrived.", &self.staleness.lock());
        m.latency("pull", "Time to get a step's parameters (waiting for a pull ahead included).", &self.pull);
        m.latency("push", "Time to push a step's gradients and have them answered.", &self.push);
        m.render()
    }
}
