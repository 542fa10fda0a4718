//! Who may join a job: the job's secret and the credentials derived from it ([`auth`]), and TLS
//! ([`tls`]). Crypto comes from maintained crates, none written here.
//!
//! The trust model. A job has one master secret (`--secret-file`; the launchers make one per
//! run) held by its servers; every other process holds a credential derived from it for its own
//! identity (`oar secret`; `oar launch` gives each trainer its own), and the trainer a connection
//! acts for comes from its proof, never from its `Hello`. A connection proves its key with a
//! challenge and response before the server reads anything else, the server proves it back for
//! the index the client dialed (a relay fails), and a peer without it is refused with a line
//! that names nothing of the job. The rendezvous does the same. Without a secret (Paddle-style
//! manual starts) anyone who can reach the port may act as a trainer, and the server says so
//! loudly at start. TLS adds frames nobody on the path can read or change.
//!
//! With or without a secret, no input may stop, stall or poison a server: before the handshake
//! only a 64 KiB frame within `--handshake-timeout`, and a frame's buffer grows with the bytes
//! that arrive; at most `--max-connections` (more refused with `Busy`, logged at most once a
//! second, no hot loop on accept errors); TCP keepalive finds a peer whose host vanished; a
//! declaration is costed before anything is allocated (`--max-declare-mb`, rows of at most 65,536
//! floats, 4,096 tables); a push holding a NaN, an infinity or a value beyond ±1e18 is refused
//! before it touches a table (`--nonfinite fail|skip`); a push sent twice is applied once
//! (`server/ledger.rs`); close, end of pass, barrier and push act for a trainer of the job, a
//! trainer's connection only for itself, and a tool's connection (one that names no trainer) only
//! reads; a `Save` writes only inside `--save-root` (a relative folder is taken inside it, `..`
//! refused, links resolved); restart files are checked (`base/state_file.rs`), and a checkpoint
//! of another job is never loaded.

pub mod auth;
pub mod tls;
