//! oar: a parameter-server system for distributed training of recommendation models.
#![warn(missing_docs)]

pub mod layout;
pub mod table;
pub mod protocol;
pub mod checkpoint;
pub mod server;
pub mod client;
pub mod nn;
