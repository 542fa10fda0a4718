//! Requests to every server answered with JSON: the counters, a shrink of the sparse tables,
//! a base or delta save.

use super::{Client, ClientError};
use crate::protocol::ServerStats;
use crate::protocol::{Request, Response, Shrunk};

impl Client {
    /// Every server's counters.
    pub fn stats(&mut self) -> Result<Vec<ServerStats>, ClientError> {
        self.json_round(&Request::Stats)
    }

    /// Shrinks every server's sparse tables after `days` more days (0: within the day): each
    /// server's deletions and rows left per table. An operator's shrink: applied every time.
    pub fn shrink(&mut self, days: u32) -> Result<Vec<Shrunk>, ClientError> {
        self.json_round(&Request::Shrink { days: days as u64, day_end: 0 })
    }

    /// The shrink of one day's end, after pass `pass` (one more day): each server applies it
    /// once, whoever sends it how often, and a server restarted from a checkpoint taken before
    /// it is sent it again when this client reconnects (answered as a repeat where it is held).
    pub fn shrink_day_end(&mut self, pass: u32) -> Result<Vec<Shrunk>, ClientError> {
        let pass = u64::from(pass);
        if self.day_ends.last().is_none_or(|&last| last < pass) {
            self.day_ends.push(pass);
        }
        self.json_round(&Request::Shrink { days: 1, day_end: pass })
    }

    /// Every server's base or delta save into `dir`, with what each wrote.
    pub fn export(
        &mut self,
        dir: &str,
        kind: crate::protocol::ExportKind,
    ) -> Result<Vec<crate::protocol::Exported>, ClientError> {
        self.json_round(&Request::Export { dir: dir.to_string(), kind })
    }

    /// `request` to every server, each answer read from its JSON.
    fn json_round<T: serde::de::DeserializeOwned>(&mut self, request: &Request) -> Result<Vec<T>, ClientError> {
        let what = request.name();
        self.round(request, what, |conn, reply| match reply {
            Response::Stats(json) => serde_json::from_str(&json).map_err(|e| conn.mismatch(what, e.to_string())),
            other => Err(conn.unexpected(what, &other)),
        })
    }
}
