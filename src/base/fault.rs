//! Faults injected on purpose, for the fault-tolerance tests and the recovery benchmark:
//! `OAR_FAULT=<process>:<action>@<moment>`, read once per process. The fault fires only in the
//! first incarnation (epoch 0) of the process it names, so a restarted server runs clean.
//!
//! Only a binary built with the `faults` cargo feature (the tests and the recovery benchmark
//! turn it on) reads the variable at all: in a release build without it, [`at`] does nothing,
//! so a stray `OAR_FAULT` in a production environment can never kill a process.
//!
//! - process: `server<K>` or `trainer<K>`;
//! - action: `kill` (SIGKILL to itself: no cleanup, exactly `kill -9`) or `stop` (SIGSTOP: the
//!   process freezes with its sockets open, as a hung or paused machine);
//! - moment: `version=N` (a server, once it has applied N updates), `checkpoint=N` (a server,
//!   midway through writing its N-th checkpoint of the run: the shard file written, not yet
//!   published), `step=N` (a trainer, after pushing its N-th step), `sent=N` (a trainer, once its
//!   push of step number N is written to every server and before any reply is read: the push
//!   is pending at the servers when the process dies), `sent-first=N` (the same, written to
//!   server 0 only), `committed=N` and `committed-first=N` (a trainer of a sync step of several
//!   servers, once its commit of step N is written to every server, or to server 0 only),
//!   `unanswered=N` (a server in a
//!   synchronous step: the step that makes version N is answered to trainer 0 only, the other
//!   trainers' replies are held back, and the fault fires when trainer 0's next push arrives:
//!   one trainer has moved on while another never learnt its step was applied; trainer 0 must
//!   take part in that step and push again through a sync step, or the held trainers wait
//!   until their reply timeout), `dayend=N` (trainer 0 at the end of an online day: 1 before
//!   its shrink, 2 after the shrink, 3 after the save for serving, 4 after the pass's save),
//!   `shrunk=N` (a server, having applied the shrink of the day end after pass N and before
//!   answering it: no checkpoint of it holds that shrink).
//!
//! A launcher passes its environment to its children, so one variable reaches the process named.

use std::sync::OnceLock;

/// What to do to the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL.
    Kill,
    /// SIGSTOP.
    Stop,
}

/// When it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// A server has applied this many updates.
    Version(u64),
    /// A server is writing its N-th checkpoint of this run.
    Checkpoint(u64),
    /// A trainer has pushed this many steps.
    Step(u64),
    /// A trainer has sent its push of this step number, and read no reply yet.
    Sent(u64),
    /// A trainer has sent its push of this step number to server 0, and to no other.
    SentFirst(u64),
    /// A trainer has sent its commit of this step number, and read no reply yet.
    Committed(u64),
    /// A trainer has sent its commit of this step number to server 0, and to no other.
    CommittedFirst(u64),
    /// A server's sync step making this version was answered to trainer 0 only, and trainer 0
    /// pushes again.
    Unanswered(u64),
    /// Trainer 0 at the end of an online day: 1 before the shrink, 2 after it, 3 after the
    /// save for serving, 4 after the pass's save.
    DayEnd(u64),
    /// A server has applied the shrink of the day end after this pass, and not answered it.
    Shrunk(u64),
}

/// Which process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Server of this index.
    Server(usize),
    /// Trainer of this id.
    Trainer(usize),
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Which process.
    pub target: Target,
    /// What happens to it.
    pub action: Action,
    /// When.
    pub moment: Moment,
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = || {
            format!(
                "OAR_FAULT={s:?}: expected <server|trainer><K>:<kill|stop>@<version|checkpoint|step|sent|unanswered|dayend|shrunk>=N"
            )
        };
        let (who, rest) = s.split_once(':').ok_or_else(bad)?;
        let (action, moment) = rest.split_once('@').ok_or_else(bad)?;
        let (kind, n) = moment.split_once('=').ok_or_else(bad)?;
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        let target = if let Some(k) = who.strip_prefix("server") {
            Target::Server(k.parse().map_err(|_| bad())?)
        } else if let Some(k) = who.strip_prefix("trainer") {
            Target::Trainer(k.parse().map_err(|_| bad())?)
        } else {
            return Err(bad());
        };
        let action = match action {
            "kill" => Action::Kill,
            "stop" => Action::Stop,
            _ => return Err(bad()),
        };
        let moment = match kind {
            "version" => Moment::Version(n),
            "checkpoint" => Moment::Checkpoint(n),
            "step" => Moment::Step(n),
            "sent" => Moment::Sent(n),
            "sent-first" => Moment::SentFirst(n),
            "committed" => Moment::Committed(n),
            "committed-first" => Moment::CommittedFirst(n),
            "unanswered" => Moment::Unanswered(n),
            "dayend" => Moment::DayEnd(n),
            "shrunk" => Moment::Shrunk(n),
            _ => return Err(bad()),
        };
        Ok(Fault { target, action, moment })
    }
}

fn planned() -> Option<Fault> {
    static PLAN: OnceLock<Option<Fault>> = OnceLock::new();
    *PLAN.get_or_init(|| {
        let spec = std::env::var("OAR_FAULT").ok().filter(|s| !s.trim().is_empty())?;
        match spec.parse() {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::error!("{e}; no fault injected");
                None
            }
        }
    })
}

/// This process's trainer life: 0, or 1 for a restarted trainer (set once it knows).
static TRAINER_LIFE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets this trainer process's life (1 for a restart), for faults fired where it is not known.
pub fn set_trainer_life(life: u64) {
    TRAINER_LIFE.store(life, std::sync::atomic::Ordering::Relaxed);
}

/// Fires the planned fault if it is for trainer `trainer` in its first life at `moment`.
pub fn at_trainer(trainer: usize, moment: Moment) {
    at(Target::Trainer(trainer), TRAINER_LIFE.load(std::sync::atomic::Ordering::Relaxed), moment);
}

/// Whether a fault is planned for `target` (in its first epoch) at `moment`: where a fault
/// needs the process to act before it fires (`unanswered`). Without the `faults` feature: never.
pub fn is_planned(target: Target, epoch: u64, moment: Moment) -> bool {
    cfg!(feature = "faults") && epoch == 0 && planned().is_some_and(|f| f.target == target && f.moment == moment)
}

/// Fires the planned fault if it is for `target` (in its first epoch) at `moment`. Without the
/// `faults` feature it does nothing.
pub fn at(target: Target, epoch: u64, moment: Moment) {
    if !is_planned(target, epoch, moment) {
        return;
    }
    let Some(f) = planned() else { return };
    let signal = match f.action {
        Action::Kill => libc::SIGKILL,
        Action::Stop => libc::SIGSTOP,
    };
    eprintln!("OAR_FAULT: {target:?} {:?} at {moment:?}", f.action);
    // SAFETY: raise() sends a signal to this process; it has no memory-safety preconditions.
    unsafe {
        libc::raise(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_parse_and_bad_ones_are_named() {
        let f: Fault = "server1:kill@version=150".parse().unwrap();
        assert_eq!(f, Fault { target: Target::Server(1), action: Action::Kill, moment: Moment::Version(150) });
        let f: Fault = "trainer0:stop@step=3".parse().unwrap();
        assert_eq!(f, Fault { target: Target::Trainer(0), action: Action::Stop, moment: Moment::Step(3) });
        assert!("server1:kill@checkpoint=2".parse::<Fault>().unwrap().moment == Moment::Checkpoint(2));
        assert!("trainer1:kill@sent=7".parse::<Fault>().unwrap().moment == Moment::Sent(7));
        assert!("trainer1:kill@committed-first=7".parse::<Fault>().unwrap().moment == Moment::CommittedFirst(7));
        assert!("server0:kill@unanswered=9".parse::<Fault>().unwrap().moment == Moment::Unanswered(9));
        assert!("trainer0:kill@dayend=2".parse::<Fault>().unwrap().moment == Moment::DayEnd(2));
        for bad in ["server:kill@version=1", "server1:explode@version=1", "server1:kill@hour=1", "worker1:kill@step=1"]
        {
            assert!(bad.parse::<Fault>().unwrap_err().contains("expected"), "{bad}");
        }
    }
}
