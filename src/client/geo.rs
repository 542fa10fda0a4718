//! GEO mode's question to every server: which rows changed since this trainer last asked.

use super::{Client, ClientError};
use crate::protocol::{Request, Response};

/// The rows the servers' tables changed since a trainer last asked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Per sparse table, the ids changed (each server's own; none twice).
    pub ids: Vec<Vec<u64>>,
    /// A server could not say which (it restarted, or forgot what this trainer had not read):
    /// every row the trainer holds may have changed.
    pub all: bool,
}

impl Client {
    /// GEO mode: the rows changed on every server since `trainer` last asked.
    pub fn changed(&mut self, trainer: usize, tables: usize) -> Result<Changed, ClientError> {
        let what = "the rows changed";
        let request = Request::Changed { trainer: trainer as u64 };
        let replies = self.round(&request, what, |conn, reply| match reply {
            Response::Changed { all, ids } if all || ids.len() == tables => {
                Ok((all, ids.into_iter().map(|t| t.into_owned()).collect::<Vec<_>>()))
            }
            Response::Changed { ids, .. } => {
                Err(conn.mismatch(what, format!("ids of {} tables, the model has {tables}", ids.len())))
            }
            other => Err(conn.unexpected(what, &other)),
        })?;
        let mut changed = Changed { ids: vec![Vec::new(); tables], all: false };
        for (all, ids) in replies {
            changed.all |= all;
            for (into, t) in changed.ids.iter_mut().zip(ids) {
                into.extend(t);
            }
        }
        Ok(changed)
    }
}
