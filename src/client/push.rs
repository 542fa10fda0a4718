//! A step's push: the gradients split by owner (dense blocks where they lie, sparse rows by
//! id), sent to every server at once.

use std::borrow::Cow;

use super::{Client, ClientError, PushReport, StepHeader, TableGrads};
use crate::layout::group_by_server;
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
        let split = dense.is_some() && !tables.is_empty() && self.has_sparse_ports();
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
        let sent = || crate::fault::at_trainer(trainer, crate::fault::Moment::Sent(step));
        let outcomes = self.exchange_then(&parts, sent, |conns, s| {
            let (mut stale, mut staleness) = (false, 0);
            for port in std::iter::once(first).chain(second) {
                let conn = &mut conns[port][s];
                let kind = conn.read()?;
                match conn.reply(kind, "a push")? {
                    Response::Pushed { outcome, version } => {
                        stale |= outcome == PushOutcome::Discarded;
                        // An applied push answers the version it made, a discarded one the
                        // version it found.
                        let found = if outcome == PushOutcome::Applied { version.saturating_sub(1) } else { version };
                        staleness = staleness.max(found.saturating_sub(bases[s]));
                    }
                    other => return Err(conn.unexpected("a push", &other)),
                }
            }
            Ok((stale, staleness))
        })?;
        let discarded = outcomes.iter().filter(|(stale, _)| *stale).count();
        let staleness = outcomes.iter().map(|(_, k)| *k).max().unwrap_or(0);
        Ok(PushReport { discarded, staleness })
    }
}
