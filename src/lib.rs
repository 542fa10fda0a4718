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

/// `paddle.init(**kwargs)` for oar: the cluster settings of the environment, with the
/// arguments overriding `PADDLE_INIT_*` (see [`base::env::ClusterEnv::init`]).
pub fn init(args: &[(&str, &str)]) -> Result<base::env::ClusterEnv, base::env::EnvError> {
    base::env::ClusterEnv::init(args)
}
