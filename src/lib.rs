//! oar: a parameter-server system for distributed training of recommendation models.
#![warn(missing_docs)]

pub mod base;
pub mod bench;
pub mod cli;
pub mod client;
pub mod data;
pub mod model;
pub mod nn;
pub mod observe;
pub mod onnx;
pub mod persist;
pub mod protocol;
pub mod run;
pub mod security;
pub mod serve;
pub mod server;
pub mod table;
pub mod train;

// The old paths of the modules moved into layer folders, until their users move.
pub use base::batch;
pub use base::env;
pub use base::exit;
pub use base::fault;
pub use base::http;
pub use base::layout;
pub use base::per_address;
pub use base::state_file;
pub use observe::curves;
pub use observe::metrics;
pub use observe::telemetry;
pub use persist::checkpoint;
pub use persist::export;
pub use run::cluster;
pub use run::launch;
pub use run::rendezvous;
pub use run::supervise;
pub use security::auth;
pub use security::tls;
pub use serve::model_export;
pub use serve::predict;
pub use server::ledger;
pub use server::shard_checkpoints;
pub use train::job_config as config;

/// `paddle.init(**kwargs)` for oar: the cluster settings of the environment, with the
/// arguments overriding `PADDLE_INIT_*` (see [`env::ClusterEnv::init`]).
pub fn init(args: &[(&str, &str)]) -> Result<env::ClusterEnv, env::EnvError> {
    env::ClusterEnv::init(args)
}
