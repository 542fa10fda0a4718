//! Where a trainer's parameters live ([`Store`]: in-process or on servers) and the per-batch
//! id deduplication that decides what to pull and push.

use std::path::Path;

use hashbrown::HashMap;

use crate::checkpoint::{write_shard, ShardEntry};
use crate::client::{Client, TableGrads, TableIds};
use crate::protocol::RowCreation;
use crate::table::Shard;

/// Where parameters live: in this process, or on servers.
pub enum Store {
    /// All tables in-process (local mode, evaluation).
    Local(Box<Shard>),
    /// Tables on servers.
    Remote(Box<Client>),
}

impl Store {
    /// Pulls the dense vector (if asked) and the rows of `ids`; returns the parameter version.
    pub fn pull(
        &mut self,
        dense: Option<&mut Vec<f32>>,
        ids: &[u64],
        rows: &mut Vec<f32>,
        dim: usize,
        create: RowCreation,
    ) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard) => {
                if let Some(d) = dense {
                    d.clear();
                    shard.dense.lock().read(d);
                }
                rows.resize(ids.len() * dim, 0.0);
                shard.sparse[0].pull(ids, rows, create == RowCreation::Create)?;
                Ok(0)
            }
            Store::Remote(client) => {
                let table = TableIds { table: 0, dim, ids };
                let mut out = [std::mem::take(rows)];
                let v = client.pull(dense, std::slice::from_ref(&table), &mut out, create)?;
                *rows = std::mem::take(&mut out[0]);
                Ok(v)
            }
        }
    }

    /// Pushes one step's gradient sums; returns the number of servers that discarded it.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        trainer: usize,
        step: u64,
        pass: u32,
        version: u64,
        samples: usize,
        dense: &[f32],
        ids: &[u64],
        row_grads: &[f32],
        dim: usize,
    ) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard) => {
                shard.apply(dense, [(0, ids, row_grads)], samples as u64)?;
                Ok(0)
            }
            Store::Remote(client) => {
                let grads = TableGrads { table: 0, dim, ids, grads: row_grads };
                let r =
                    client.push(trainer, step, pass, version, samples, Some(dense), std::slice::from_ref(&grads))?;
                Ok(r.discarded as u64)
            }
        }
    }

    /// Saves every shard into `dir`.
    pub fn save(&mut self, dir: &Path) -> anyhow::Result<Vec<ShardEntry>> {
        match self {
            Store::Local(shard) => {
                let (file, bytes, crc32) = write_shard(shard, dir)?;
                Ok(vec![ShardEntry { file, bytes, crc32 }])
            }
            Store::Remote(client) => Ok(client.save(&dir.to_string_lossy())?),
        }
    }
}

/// Ids of a batch made unique, with each (sample, slot) mapped to its unique position.
#[derive(Default)]
pub struct Dedup {
    map: HashMap<u64, u32, foldhash::fast::FixedState>,
    /// Unique ids in first-seen order.
    pub unique: Vec<u64>,
    /// Position in `unique` of every id of the batch.
    pub index: Vec<u32>,
}

impl Dedup {
    /// Deduplicates `ids`.
    pub fn run(&mut self, ids: &[u64]) {
        self.map.clear();
        self.unique.clear();
        self.index.clear();
        for &id in ids {
            let next = self.unique.len() as u32;
            let at = *self.map.entry(id).or_insert(next);
            if at == next {
                self.unique.push(id);
            }
            self.index.push(at);
        }
    }
}
