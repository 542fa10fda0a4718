//! The base layer: plain types and pure functions every other layer shares (a batch, where
//! a parameter lives, exit statuses, the cluster environment, injected faults, the small files a
//! restart trusts, connections counted per address, the bounded HTTP listener, the program oar's
//! children run).

pub mod batch;
pub mod env;
pub mod exit;
pub mod fault;
pub mod http;
pub mod layout;
pub mod per_address;
pub mod program;
pub mod state_file;
