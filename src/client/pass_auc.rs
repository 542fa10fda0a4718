//! A pass's training AUC over every trainer's samples: each trainer sends server 0 its
//! histogram of Paddle's AUC buckets, and after the end-of-pass barrier reads them merged.

use super::{Client, ClientError};
use crate::observe::metrics::AucBuckets;
use crate::protocol::{GlobalAuc, Request, Response};

impl Client {
    /// Sends server 0 trainer `trainer`'s histogram of its pass-`pass` predictions.
    pub fn pass_auc(&mut self, trainer: usize, pass: u32, buckets: &AucBuckets) -> Result<(), ClientError> {
        let request = Request::PassAuc {
            trainer: trainer as u64,
            pass: pass as u64,
            pos: buckets.pos.as_slice().into(),
            neg: buckets.neg.as_slice().into(),
            sums: buckets.sums,
        };
        self.on_first(&request, |conn| conn.expect_done("a pass AUC histogram"))
    }

    /// Pass `pass`'s histograms merged on server 0, with the trainers that sent one.
    pub fn global_auc(&mut self, pass: u32) -> Result<GlobalAuc, ClientError> {
        let what = "a global AUC request";
        self.on_first(&Request::GlobalAuc { pass: pass as u64 }, |conn| {
            let kind = conn.read()?;
            let conn = &*conn;
            match conn.reply(kind, what)? {
                Response::Stats(json) => serde_json::from_str(&json).map_err(|e| conn.mismatch(what, e.to_string())),
                other => Err(conn.unexpected(what, &other)),
            }
        })
    }
}
