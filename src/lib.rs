//! oar: a parameter-server system for distributed training of recommendation models.
#![warn(missing_docs)]

pub mod auth;
pub mod batch;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod curves;
pub mod data;
pub mod env;
pub mod exit;
pub mod export;
pub mod fault;
pub mod http;
pub mod launch;
pub mod layout;
pub mod ledger;
pub mod metrics;
pub mod model;
pub mod model_export;
pub mod nn;
pub mod onnx;
pub mod per_address;
pub mod predict;
pub mod protocol;
pub mod rendezvous;
pub mod serve;
pub mod server;
pub mod shard_checkpoints;
pub mod state_file;
pub mod supervise;
pub mod table;
pub mod telemetry;
pub mod tls;
pub mod train;

/// `paddle.init(**kwargs)` for oar: the cluster settings of the environment, with the
/// arguments overriding `PADDLE_INIT_*` (see [`env::ClusterEnv::init`]).
pub fn init(args: &[(&str, &str)]) -> Result<env::ClusterEnv, env::EnvError> {
    env::ClusterEnv::init(args)
}
