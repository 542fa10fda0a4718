//! Exit statuses of an oar process, chosen from its error, so a launcher (oar's own, or a
//! cluster engine's logs) can tell a member that failed from one that stopped because another
//! was lost: [`PEER_LOST`] (3) when a peer was lost ([`PeerLost`] anywhere in the error's chain,
//! a client error whose server was lost, or a refusal by a server that gave up waiting for
//! another trainer), else [`FAILED`] (1); clap exits with [`USAGE`] (2) on
//! a bad command line. [`fails_again`] says which of them a restart would meet again, so a
//! launcher restarts only what a restart can help. Pure: the status of an error is read in
//! `cli/status.rs`, above every layer whose errors it names, and the command line prints the
//! error as one line, `oar: error: ...`.
//!
//! Why a status and not the message: when a trainer fails, every server reports losing it and
//! exits too, within milliseconds; a launcher that reads their last lines in the order the
//! processes end (or its pipe readers get to run) names the servers' reports first about as
//! often as the trainer's own error. The status is set by the failing process itself, from the
//! error's type, so the order it gives does not depend on timing.
//!
//! Errors are `thiserror` enums where callers branch on them (`ProtocolError`, `ClientError`,
//! `TableError`, `CheckpointError`, `DataError`), and `anyhow` with context above them, so the one
//! line printed says where as well as what.

/// The process failed on its own (bad input, a refused request, a bug).
pub const FAILED: i32 = 1;
/// A command line clap refused (clap's own status).
pub const USAGE: i32 = 2;
/// The process stopped because another member of the job was lost: a server whose trainer
/// disconnected without closing, a trainer whose server went away and did not come back, a
/// trainer whose server gave up waiting for another trainer.
pub const PEER_LOST: i32 = 3;

/// The error a process stops with when a peer it cannot finish without is gone.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PeerLost(pub String);

/// What a launcher says of a process it did not restart because it [`fails_again`].
pub const NOT_RESTARTED: &str =
    "not restarted: it stopped on its own error (bad input or a refusal), which a restart would meet again";

/// Whether a process that ended with `status` would end the same way if started again: it
/// stopped on its own error ([`FAILED`]: bad input, a refused request or job file; or
/// [`USAGE`]: its command line), which a restart meets again. A launcher's `--max-restarts` restarts the others: a process killed by a
/// signal (a crash, the out-of-memory killer, a keeper's kill of a hung one), one that lost a
/// peer, one that panicked.
pub fn fails_again(status: &std::process::ExitStatus) -> bool {
    matches!(status.code(), Some(FAILED | USAGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_process_that_failed_on_its_own_error_would_fail_again() {
        use std::os::unix::process::ExitStatusExt;
        let exited = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        assert!(fails_again(&exited(FAILED)) && fails_again(&exited(USAGE)));
        for other in [exited(PEER_LOST), exited(101), std::process::ExitStatus::from_raw(libc::SIGKILL)] {
            assert!(!fails_again(&other), "{other}");
        }
    }
}
