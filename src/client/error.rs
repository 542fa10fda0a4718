//! What can go wrong talking to servers ([`ClientError`], each naming the server), and which
//! of it a restarted server could cure (unit-tested).

use std::time::Duration;

use crate::protocol::{ErrorCode, ProtocolError};

/// Errors talking to servers; each names the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made before the deadline.
    #[error("cannot reach server {index} at {addr} within {timeout:?}: {cause}")]
    Unreachable {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// How long we tried.
        timeout: Duration,
        /// The last connect error.
        cause: String,
    },
    /// The connection failed mid-request (including reply timeouts).
    #[error("server {index} at {addr}: {cause}")]
    Protocol {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// The cause.
        cause: ProtocolError,
    },
    /// The server answered with an error.
    #[error("server {index} at {addr} refused {what}: {message}")]
    Refused {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// The request.
        what: &'static str,
        /// The server's error class (a `Timeout` may be retried, a `Table` error not).
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The server answered with an unexpected message.
    #[error("server {index} at {addr} answered {what} with {got}")]
    Unexpected {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// The request.
        what: &'static str,
        /// What came back.
        got: String,
    },
    /// A server answered the handshake with an epoch older than one met before: a replaced
    /// process (stopped, then continued) still holds the address.
    #[error("server {index} at {addr} is epoch {epoch}, older than epoch {met} met before: a replaced process")]
    Replaced {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// The epoch it answered.
        epoch: u64,
        /// The newest epoch met.
        met: u64,
    },
    /// The process at a server's address did not prove it holds the job's secret for that
    /// server: another job's or another server's, a relay, or a wrong `--secret-file`.
    #[error("server {index} at {addr}: {why}")]
    Unproven {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// What it failed to prove, and the likely causes.
        why: String,
    },
    /// A server was lost and did not come back within the recovery window.
    #[error("server {index} at {addr} was lost and did not come back within {waited:?} (--recover-timeout): {cause}")]
    Lost {
        /// Server index.
        index: usize,
        /// Its address.
        addr: String,
        /// How long we waited.
        waited: Duration,
        /// The last error.
        cause: String,
    },
    /// The call itself was inconsistent (a bug in the caller).
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// Whether a restarted server could cure this: the connection broke or timed out, nobody
    /// listens at the address (yet), or the process there is a replaced epoch.
    pub(super) fn is_lost_server(&self) -> bool {
        matches!(
            self,
            ClientError::Protocol { cause: ProtocolError::Io(_) | ProtocolError::Closed, .. }
                | ClientError::Unreachable { .. }
                | ClientError::Replaced { .. }
                | ClientError::Refused { code: ErrorCode::Fenced, .. }
        )
    }

    /// Whether the server gave up waiting for other trainers (a sync step or a barrier that
    /// outlasted its `--timeout`): the request itself was sound, and may be asked again while
    /// one of those trainers could still be recovering. A trainer that stops on it stopped for
    /// another member of the job, not on its own error.
    pub fn is_wait_timed_out(&self) -> bool {
        matches!(self, ClientError::Refused { code: ErrorCode::Timeout, .. })
    }

    /// Whether the other side closed or reset the connection before it answered: a process
    /// stopping or restarting behind the address, a proxy, or a Kubernetes service routing to a
    /// pod that is going away. A reply timeout is not such a close.
    pub(super) fn closed_before_answer(&self) -> bool {
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
        match self {
            ClientError::Protocol { cause: ProtocolError::Closed, .. } => true,
            ClientError::Protocol { cause: ProtocolError::Io(e), .. } => {
                matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof)
            }
            _ => false,
        }
    }

    /// Whether the server, not the request, is the cause: the connection broke or timed out,
    /// nobody listens, the process there is a replaced epoch, or the server was lost and did
    /// not come back within the recovery window.
    pub fn server_was_lost(&self) -> bool {
        self.is_lost_server() || matches!(self, ClientError::Lost { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what a restarted server cures is retried: a broken or silent connection, nobody
    /// listening yet, a replaced epoch; never a refusal of the request itself.
    #[test]
    fn only_a_lost_server_is_worth_waiting_for() {
        let at = |cause| ClientError::Protocol { index: 1, addr: "a:1".into(), cause };
        assert!(at(ProtocolError::Closed).is_lost_server());
        assert!(at(ProtocolError::Io(std::io::ErrorKind::ConnectionReset.into())).is_lost_server());
        assert!(!at(ProtocolError::Malformed("x".into())).is_lost_server());
        let refused =
            |code| ClientError::Refused { index: 0, addr: "a:1".into(), what: "a push", code, message: String::new() };
        assert!(refused(ErrorCode::Fenced).is_lost_server());
        for code in [ErrorCode::NonFinite, ErrorCode::Handshake, ErrorCode::State, ErrorCode::Busy, ErrorCode::Timeout]
        {
            assert!(!refused(code).is_lost_server(), "{code:?}");
        }
        let unreachable = ClientError::Unreachable {
            index: 0,
            addr: "a:1".into(),
            timeout: Duration::from_secs(1),
            cause: String::new(),
        };
        assert!(unreachable.is_lost_server());
        assert!(!ClientError::Usage("bad".into()).is_lost_server());
    }

    /// Of the refusals, only a wait that outlasted the server's timeout is asked again (within
    /// the recovery window): the others refuse the request itself.
    #[test]
    fn only_a_timed_out_wait_is_asked_again() {
        let refused =
            |code| ClientError::Refused { index: 0, addr: "a:1".into(), what: "a push", code, message: String::new() };
        assert!(refused(ErrorCode::Timeout).is_wait_timed_out());
        for code in [ErrorCode::NonFinite, ErrorCode::State, ErrorCode::Busy, ErrorCode::Fenced, ErrorCode::TooLarge] {
            assert!(!refused(code).is_wait_timed_out(), "{code:?}");
        }
        let silent = ClientError::Protocol {
            index: 0,
            addr: "a:1".into(),
            cause: ProtocolError::Io(std::io::ErrorKind::TimedOut.into()),
        };
        assert!(!silent.is_wait_timed_out(), "a silent server is lost, not refusing");
    }

    /// A connection closed or reset before the answer is connected again; a silent one (the
    /// reply timeout) or a refusal is not.
    #[test]
    fn a_close_before_the_answer_is_told_from_a_silence() {
        use std::io::ErrorKind::*;
        let at = |cause| ClientError::Protocol { index: 0, addr: "a:1".into(), cause };
        assert!(at(ProtocolError::Closed).closed_before_answer());
        for kind in [ConnectionReset, ConnectionAborted, BrokenPipe, UnexpectedEof] {
            assert!(at(ProtocolError::Io(kind.into())).closed_before_answer(), "{kind:?}");
        }
        for kind in [WouldBlock, TimedOut, InvalidData] {
            assert!(!at(ProtocolError::Io(kind.into())).closed_before_answer(), "{kind:?}");
        }
        assert!(!at(ProtocolError::Malformed("x".into())).closed_before_answer());
        let busy = ClientError::Refused {
            index: 0,
            addr: "a:1".into(),
            what: "the handshake",
            code: ErrorCode::Busy,
            message: String::new(),
        };
        assert!(!busy.closed_before_answer());
    }
}
