//! Watching a job: quality metrics over a pass, the Prometheus endpoint, and the learning
//! curves (CSV, TensorBoard event files, plots).

pub mod curves;
pub mod exposition;
pub mod metrics;
pub mod telemetry;
