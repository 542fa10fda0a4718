//! Requests to every server answered with JSON: the counters, a shrink of the sparse tables,
//! a base or delta save.

use super::{Client, ClientError};
use crate::protocol::{Request, Response, Shrunk};
use crate::server::ServerStats;

impl Client {
    /// Every server's counters.
    pub fn stats(&mut self) -> Result<Vec<ServerStats>, ClientError> {
        self.json_round(&Request::Stats)
    }

    /// Shrinks every server's sparse tables after `days` more days (0: within the day): each
    /// server's deletions and rows left per table.
    pub fn shrink(&mut self, days: u32) -> Result<Vec<Shrunk>, ClientError> {
        self.json_round(&Request::Shrink { days: days as u64 })
    }

    /// Every server's base or delta save into `dir`, with what each wrote.
    pub fn export(
        &mut self,
        dir: &str,
        kind: crate::export::ExportKind,
    ) -> Result<Vec<crate::export::Exported>, ClientError> {
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
