//! A step's push: the gradients split by owner (dense blocks where they lie, sparse rows by
//! id), sent to every server at once. Where servers hold a push until it is committed (a sync
//! step over several servers), the commit goes to each once all of them hold it, and a server
//! restarted meanwhile is sent the push again first.

use std::borrow::Cow;

use super::conn::Conn;
use super::{Client, ClientError, PushReport, StepHeader, TableGrads};
use crate::base::layout::group_by_server;
use crate::protocol::{Frame, Push, PushOutcome, PushPart, Request, Response, SparseGrads};

impl Client {
    /// Pushes one step's gradient sums over `samples` samples: the dense gradient (full flat
    /// vector, optional; each server's blocks are sent from where they lie, not gathered) and
    /// sparse gradients per table, each split by owner.
    pub fn push(
        &mut self,
        header: &StepHeader,
        dense: Option<&[f32]>,
        tables: &[TableGrads],
    ) -> Result<PushReport, ClientError> {
        let StepHeader { trainer, step, pass, base_version, samples, apply } = *header;
        let layout = self.layout()?;
        if let Some(d) = dense {
            if d.len() != layout.total {
                return Err(ClientError::Usage(format!(
                    "dense gradient of {} floats, model has {}",
                    d.len(),
                    layout.total
                )));
            }
        }
        let n = self.servers();
        // A dense-merged push is whole: its dense part waits in the sync step, its rows do not.
        let split = dense.is_some()
            && !tables.is_empty()
            && self.has_sparse_ports()
            && apply != crate::protocol::Apply::DenseMerged;
        // Each server's own count at the pull behind these gradients (see `Client::ahead`).
        let bases: Vec<u64> = self.ahead.iter().map(|a| base_version + a).collect();
        let mut per_server: Vec<Push> = (0..n)
            .map(|s| Push {
                trainer: trainer as u64,
                step,
                pass: pass as u64,
                base_version: bases[s],
                samples: samples as u64,
                part: PushPart::Whole,
                apply,
                dense: dense
                    .map(|d| layout.blocks_of(s).map(|b| Cow::Borrowed(&d[layout.block_range(b)])).collect())
                    .unwrap_or_default(),
                sparse: Vec::with_capacity(tables.len()),
            })
            .collect();
        for t in tables {
            if t.counts.len() != 2 * t.ids.len() || t.grads.len() != t.ids.len() * t.dim {
                return Err(ClientError::Usage(format!(
                    "table {}: {} ids with {} counts and {} gradient floats (2 and {} per id)",
                    t.table,
                    t.ids.len(),
                    t.counts.len(),
                    t.grads.len(),
                    t.dim
                )));
            }
            if n == 1 {
                // The one server's part is the whole batch, sent from where it lies.
                let (ids, counts, grads) = (Cow::Borrowed(t.ids), Cow::Borrowed(t.counts), Cow::Borrowed(t.grads));
                per_server[0].sparse.push(SparseGrads { table: t.table, ids, counts, grads });
                continue;
            }
            group_by_server(t.table, t.ids, n, &mut self.order, &mut self.starts);
            for (s, push) in per_server.iter_mut().enumerate() {
                let positions = &self.order[self.starts[s]..self.starts[s + 1]];
                let ids: Vec<u64> = positions.iter().map(|&p| t.ids[p as usize]).collect();
                let counts: Vec<f32> =
                    positions.iter().flat_map(|&p| [0, 1].map(|k| t.counts[2 * p as usize + k])).collect();
                let mut grads = Vec::with_capacity(positions.len() * t.dim);
                for &p in positions {
                    grads.extend_from_slice(&t.grads[p as usize * t.dim..(p as usize + 1) * t.dim]);
                }
                let (ids, counts, grads) = (Cow::Owned(ids), Cow::Owned(counts), Cow::Owned(grads));
                push.sparse.push(SparseGrads { table: t.table, ids, counts, grads });
            }
        }
        // Split like a pull: the server merges the halves of a sync step before applying it.
        let (first, second) =
            if split { (self.pick(false), Some(self.pick(true))) } else { (self.pick(dense.is_none()), None) };
        let requests: Vec<Vec<(usize, Request)>> = per_server
            .into_iter()
            .map(|push| match second {
                Some(port) => {
                    let sparse_half = Push { part: PushPart::Sparse, dense: Vec::new(), ..push.clone() };
                    let dense_half = Push { part: PushPart::Dense, sparse: Vec::new(), ..push };
                    vec![(first, Request::Push(dense_half)), (port, Request::Push(sparse_half))]
                }
                None => vec![(first, Request::Push(push))],
            })
            .collect();
        let parts: Vec<Vec<(usize, Frame)>> =
            requests.iter().map(|r| r.iter().map(|(port, req)| (*port, req.encode())).collect()).collect();
        let ports: Vec<usize> = std::iter::once(first).chain(second).collect();
        let (me, last) = (trainer as u64, n - 1);
        let sent = |s: usize| {
            use crate::base::fault::{at_trainer, Moment};
            if s == 0 {
                at_trainer(trainer, Moment::SentFirst(step));
            }
            if s == last {
                at_trainer(trainer, Moment::Sent(step));
            }
        };
        let mut outcomes = self.exchange_then(&parts, sent, |conns, s| read_pushed(conns, s, &ports, bases[s]))?;
        if outcomes.iter().any(|o| o.held) {
            let committed = self.commit(me, step, &parts, &ports, &outcomes, &bases)?;
            for (o, c) in outcomes.iter_mut().zip(committed) {
                *o = c.unwrap_or(*o);
            }
        }
        let outcomes: Vec<(bool, u64)> = outcomes.iter().map(|o| (o.stale, o.staleness)).collect();
        let discarded = outcomes.iter().filter(|(stale, _)| *stale).count();
        let staleness = outcomes.iter().map(|(_, k)| *k).max().unwrap_or(0);
        Ok(PushReport { discarded, staleness })
    }

    /// The commit phase of a sync push held by servers of several (`outcomes[s].held`): every
    /// server holds it, so each is told to apply it. A server restarted from a checkpoint since
    /// the push answers `NotHeld` and is sent the push again first. Returns the final answer of
    /// each server committed to.
    fn commit(
        &mut self,
        trainer: u64,
        step: u64,
        pushes: &[Vec<(usize, Frame<'_>)>],
        ports: &[usize],
        outcomes: &[Pushed],
        bases: &[u64],
    ) -> Result<Vec<Option<Pushed>>, ClientError> {
        let commit = Request::Commit { trainer, step };
        let parts: Vec<Vec<(usize, Frame)>> =
            outcomes.iter().map(|o| if o.held { vec![(ports[0], commit.encode())] } else { Vec::new() }).collect();
        let last = parts.len() - 1;
        let committed = |s: usize| {
            use crate::base::fault::{at_trainer, Moment};
            if s == 0 {
                at_trainer(trainer as usize, Moment::CommittedFirst(step));
            }
            if s == last {
                at_trainer(trainer as usize, Moment::Committed(step));
            }
        };
        self.exchange_then(&parts, committed, |conns, s| {
            if !outcomes[s].held {
                return Ok(None);
            }
            let answer = read_pushed(conns, s, &ports[..1], bases[s])?;
            if !answer.not_held {
                return Ok(Some(answer));
            }
            tracing::warn!(server = s, step, "server {s} no longer holds this push (it restarted): sent again");
            for (port, frame) in &pushes[s] {
                conns[*port][s].send(frame)?;
            }
            read_pushed(conns, s, ports, bases[s])?;
            conns[ports[0]][s].send(&commit.encode())?;
            let answer = read_pushed(conns, s, &ports[..1], bases[s])?;
            if answer.not_held {
                let conn = &conns[ports[0]][s];
                return Err(
                    conn.unexpected("a commit", &Response::Pushed { outcome: PushOutcome::NotHeld, version: 0 })
                );
            }
            Ok(Some(answer))
        })
    }
}

/// One server's answer to a push (both halves of a split one) or a commit.
#[derive(Clone, Copy, Debug, Default)]
struct Pushed {
    /// A part was discarded as too stale.
    stale: bool,
    /// How many updates the push's parameters were behind the version it found.
    staleness: u64,
    /// The server holds it until the trainer commits it.
    held: bool,
    /// A commit found nothing held.
    not_held: bool,
}

/// Reads server `s`'s answers on `ports`, one each; `base` is its count behind the push. A
/// refusal is returned once every port's answer is read: the push may be sent again on the
/// same connections (a sync step past the server's timeout), whose answers must then be next.
fn read_pushed(conns: &mut [Vec<Conn>], s: usize, ports: &[usize], base: u64) -> Result<Pushed, ClientError> {
    let mut answer = Pushed::default();
    let mut refused = None;
    for &port in ports {
        let conn = &mut conns[port][s];
        let kind = conn.read()?;
        match conn.reply(kind, "a push") {
            Err(e) => {
                refused.get_or_insert(e);
            }
            Ok(Response::Pushed { outcome, version }) => {
                answer.stale |= outcome == PushOutcome::Discarded;
                answer.held |= outcome == PushOutcome::Held;
                answer.not_held |= outcome == PushOutcome::NotHeld;
                // An applied push answers the version it made, a discarded one the version it
                // found.
                let found = if outcome == PushOutcome::Applied { version.saturating_sub(1) } else { version };
                answer.staleness = answer.staleness.max(found.saturating_sub(base));
            }
            Ok(other) => return Err(conn.unexpected("a push", &other)),
        }
    }
    refused.map_or(Ok(answer), Err)
}
