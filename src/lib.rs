//! oar: a parameter-server system for distributed training of recommendation models.
#![warn(missing_docs)]

pub mod bench;
pub mod checkpoint;
pub mod client;
pub mod config;
pub mod data;
pub mod env;
pub mod launch;
pub mod layout;
pub mod metrics;
pub mod model;
pub mod nn;
pub mod protocol;
pub mod server;
pub mod table;
pub mod train;
