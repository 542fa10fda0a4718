//! Who may send what: every request's sender class (anyone reads; only a trainer of the job
//! declares or creates rows; only trainer t pushes, commits, ends a pass, waits or closes for
//! t; only trainer 0 or an operator saves or runs a day end's shrink; only an operator shrinks
//! otherwise), the refusal that names why, and which requests a sparse-only port refuses.

use super::State;
use crate::protocol::{DenseSelection, Request, RowCreation, NOT_A_TRAINER};
use crate::security::auth::Identity;

/// Why a request may not use a sparse-only port, if it may not.
pub(super) fn dense_on_sparse_port(request: &Request) -> Option<&'static str> {
    match request {
        Request::Pull(p) if p.dense == DenseSelection::All => Some("a dense pull"),
        Request::Push(p) if !p.dense.is_empty() => Some("a dense push"),
        _ => None,
    }
}

/// Who may send a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    /// Any greeted connection, a tool's too: reads that change nothing.
    Anyone,
    /// A connection of one of this job's trainers: a declaration, a pull that creates rows.
    AnyTrainer,
    /// A connection of this trainer only: its push, pass end, barrier or close.
    Trainer(u64),
    /// Trainer 0 (which saves and ends the days of a job) or an operator: a save, a save for
    /// serving, a day end's shrink.
    FirstTrainerOrOperator,
    /// An operator: a shrink of the whole table at any time, which `oar shrink` runs against
    /// live servers (on a server without a secret, anyone).
    Operator,
}

/// Who may send `request`.
fn sender(request: &Request) -> Sender {
    match request {
        Request::Close { trainer } | Request::EndPass { trainer, .. } | Request::Barrier { trainer, .. } => {
            Sender::Trainer(*trainer)
        }
        Request::Push(p) => Sender::Trainer(p.trainer),
        Request::Commit { trainer, .. } | Request::Changed { trainer } => Sender::Trainer(*trainer),
        Request::PassAuc { trainer, .. } => Sender::Trainer(*trainer),
        Request::Declare(_) => Sender::AnyTrainer,
        Request::Save { .. } | Request::Export { .. } => Sender::FirstTrainerOrOperator,
        Request::Shrink { day_end, .. } if *day_end > 0 => Sender::FirstTrainerOrOperator,
        Request::Pull(p) if p.create == RowCreation::Create => Sender::AnyTrainer,
        Request::Hello(_) | Request::Pull(_) | Request::Stats | Request::GlobalAuc { .. } => Sender::Anyone,
        Request::Shrink { .. } => Sender::Operator,
    }
}

/// Whether a connection whose handshake named `connection` and that proved `proven` may send
/// `request`: only a trainer of this job changes the model, and only for itself, so that a
/// tool, a stray or a buggy client cannot push, declare, close, end or hold back a trainer, or
/// end the job early with an id beyond the job's trainers; and with a secret, only an operator
/// (or the master's holder) runs an operator's command.
pub(super) fn may_send(state: &State, connection: Option<u64>, proven: Option<Identity>, request: &Request) -> bool {
    let trainers = state.config.trainers as u64;
    let own = connection.filter(|c| *c != NOT_A_TRAINER && *c < trainers);
    let operator = match proven {
        None => state.config.secret.is_none(),
        Some(identity) => matches!(identity, Identity::Master | Identity::Operator),
    };
    match sender(request) {
        Sender::Anyone => true,
        Sender::AnyTrainer => own.is_some(),
        Sender::Trainer(t) => own == Some(t),
        Sender::FirstTrainerOrOperator => own == Some(0) || (operator && proven.is_some()),
        Sender::Operator => operator,
    }
}

/// The refusal of a request this connection may not send.
pub(super) fn refusal(state: &State, connection: Option<u64>, proven: Option<Identity>, request: &Request) -> String {
    let this = match (connection, proven) {
        (Some(t), _) if t != NOT_A_TRAINER => format!("trainer {t}'s"),
        (_, Some(Identity::Operator)) => "an operator's".to_string(),
        _ => "not a trainer's (a tool's)".to_string(),
    };
    let trainers = state.config.trainers;
    match sender(request) {
        Sender::Trainer(t) => {
            format!(
                "request for trainer {t} refused: this job has trainers 0..{trainers} and this connection is {this}"
            )
        }
        Sender::FirstTrainerOrOperator => format!(
            "{} refused: only trainer 0 or an operator may send it and this connection is {this}",
            request.name()
        ),
        Sender::Operator => {
            format!("{} refused: only an operator may send it and this connection is {this}", request.name())
        }
        _ => format!(
            "{} refused: only this job's trainers (0..{trainers}) may send it and this connection is {this}",
            request.name()
        ),
    }
}
