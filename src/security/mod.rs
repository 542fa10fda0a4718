//! Who may join a job: the job's secret and the credentials derived from it, and TLS.

pub mod auth;
pub mod tls;
