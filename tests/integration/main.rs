//! Integration tests: in-process servers on loopback port 0 driven by real trainers through
//! real TCP, and end-to-end runs of the `oar` binary.

mod bad_data;
mod checkpoints;
mod cli;
mod cluster;
mod curves;
mod day_ends;
mod engines;
mod equivalence;
mod exactly_once;
mod examples;
mod export;
mod faults;
mod fetch;
mod global_auc;
mod hostile_jobs;
mod insiders;
mod interactions;
mod lifecycle;
mod models;
mod multitask;
mod norm_stats;
mod online;
mod paddle;
mod predict;
mod restarts;
mod robustness;
mod security;
mod sequences;
mod serve;
mod staleness;
mod state_files;
mod telemetry;
mod tls;
mod util;
mod zoo;
