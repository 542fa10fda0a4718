//! Where a trainer's parameters live ([`Store`]: in-process or on servers) and the per-batch,
//! per-table id deduplication that decides what to pull and push ([`Lookups`]).

use std::path::Path;

use hashbrown::HashMap;

use crate::base::batch::Batch;
pub use crate::client::StepHeader;
use crate::client::{Client, PushReport, TableGrads, TableIds};
use crate::model::TableRows;
use crate::persist::checkpoint::{write_shard, ShardEntry};
use crate::protocol::NonFinite;
use crate::protocol::RowCreation;
use crate::table::Shard;

/// Where parameters live: in this process, or on servers.
pub enum Store {
    /// All tables in-process (local mode, evaluation), and what a non-finite push does.
    Local(Box<Shard>, NonFinite),
    /// Tables on servers.
    Remote(Box<Client>),
}

impl Store {
    /// Tables in this process that fail on a non-finite push (evaluation, prediction).
    pub fn local(shard: Shard) -> Store {
        Store::Local(Box::new(shard), NonFinite::Fail)
    }

    /// Pulls the dense vector (if asked) and the rows of every table's `ids` into `rows[table]`;
    /// returns the parameter version.
    pub fn pull(
        &mut self,
        dense: Option<&mut Vec<f32>>,
        tables: &[TableIds],
        rows: &mut [Vec<f32>],
        create: RowCreation,
    ) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard, _) => {
                if let Some(d) = dense {
                    d.clear();
                    shard.dense.lock().read(d);
                }
                pull_rows(shard, tables, rows, create)?;
                Ok(0)
            }
            Store::Remote(client) => Ok(client.pull(dense, tables, rows, create)?),
        }
    }

    /// Pushes one step's gradient sums; says how many servers discarded it and how stale it
    /// arrived.
    pub fn push(&mut self, header: &StepHeader, dense: &[f32], tables: &[TableGrads]) -> anyhow::Result<PushReport> {
        match self {
            // In-process updates are never stale: a late push with no delay.
            Store::Local(..) => self.push_late(header, dense, tables, 0),
            Store::Remote(client) => Ok(client.push(header, Some(dense), tables)?),
        }
    }

    /// Local mode's delayed update: applies a push computed `staleness` updates ago, its dense
    /// step scaled as an async server would scale it (see [`crate::protocol::Apply`]).
    pub fn push_late(
        &mut self,
        header: &StepHeader,
        dense: &[f32],
        tables: &[TableGrads],
        staleness: u64,
    ) -> anyhow::Result<PushReport> {
        let Store::Local(shard, nonfinite) = self else {
            anyhow::bail!("delayed updates are a local-mode measurement")
        };
        // The servers' rule (`server::push`): a push holding a NaN, an infinity or a value beyond ±1e18 never touches
        // the model, which it would otherwise ruin silently; it fails the trainer, or with
        // `--nonfinite skip` is left out and counted as discarded.
        let sparse = tables.iter().flat_map(|t| [t.grads, t.counts]);
        if !crate::table::all_pushable(std::iter::once(dense).chain(sparse)) {
            let message = format!(
                "the gradients of step {} hold {}: refused before they touched the model ({})",
                header.step,
                crate::table::NOT_PUSHABLE,
                crate::table::NONFINITE_HINT
            );
            nonfinite.refuse(message).map_err(anyhow::Error::msg)?;
            return Ok(PushReport { discarded: 1, staleness });
        }
        let sparse = tables.iter().map(|t| (t.table as usize, t.ids, t.counts, t.grads));
        shard.apply(dense, sparse, header.samples as u64, header.apply.dense_lr_factor(staleness))?;
        Ok(PushReport { discarded: 0, staleness })
    }

    /// Every shard's base or delta save for serving into `dir` (see [`crate::persist::export`]).
    pub fn export(
        &mut self,
        kind: crate::protocol::ExportKind,
        dir: &Path,
    ) -> anyhow::Result<Vec<crate::protocol::Exported>> {
        match self {
            Store::Local(shard, _) => match crate::persist::export::collect(shard, kind) {
                Some(tables) => Ok(vec![crate::persist::export::write(shard, kind, &tables, dir)?]),
                None => Ok(vec![crate::persist::export::base_needed(shard)]),
            },
            Store::Remote(client) => Ok(client.export(&std::path::absolute(dir)?.to_string_lossy(), kind)?),
        }
    }

    /// The shrink at the end of the online day whose last pass is `pass` (one more day);
    /// returns the rows deleted. Servers apply each day end once: one they hold already (this
    /// trainer restarted after sending it) deletes nothing again.
    pub fn shrink_day_end(&mut self, pass: u32) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard, _) => Ok(shard.sparse.iter().map(|t| t.shrink(1)).sum()),
            Store::Remote(client) => {
                let shrunk = client.shrink_day_end(pass)?;
                if shrunk.iter().any(|s| s.repeat) {
                    tracing::warn!(pass, "the day end after pass {pass} was shrunk before this trainer restarted");
                }
                Ok(shrunk.iter().flat_map(|s| &s.deleted).sum())
            }
        }
    }

    /// Per server (one in-process): rows held in all tables, resident and peak memory (bytes).
    pub fn footprint(&mut self) -> anyhow::Result<Vec<(u64, u64, u64)>> {
        match self {
            Store::Local(shard, _) => {
                let (rss, peak) = crate::observe::metrics::process_memory();
                Ok(vec![(shard.sparse.iter().map(|t| t.len() as u64).sum(), rss, peak)])
            }
            Store::Remote(client) => Ok(client
                .stats()?
                .iter()
                .map(|s| (s.rows.iter().map(|&r| r as u64).sum(), s.rss_bytes, s.peak_rss_bytes))
                .collect()),
        }
    }

    /// Saves every shard into `dir`.
    pub fn save(&mut self, dir: &Path) -> anyhow::Result<Vec<ShardEntry>> {
        match self {
            Store::Local(shard, _) => {
                let (file, bytes, crc32) = write_shard(shard, dir)?;
                Ok(vec![ShardEntry { file, bytes, crc32 }])
            }
            // Absolute: a server takes a relative folder as inside its own save root.
            Store::Remote(client) => Ok(client.save(&std::path::absolute(dir)?.to_string_lossy())?),
        }
    }
}

/// Reads the rows of every table's `ids` from an in-process `shard` into `rows[table]`.
pub fn pull_rows(shard: &Shard, tables: &[TableIds], rows: &mut [Vec<f32>], create: RowCreation) -> anyhow::Result<()> {
    for (t, out) in tables.iter().zip(rows.iter_mut()) {
        out.resize(t.ids.len() * t.dim, 0.0);
        shard.table(t.table as usize)?.pull(t.ids, out, create == RowCreation::Create)?;
    }
    Ok(())
}

/// One table's ids of a batch made unique.
#[derive(Clone, Debug, Default)]
pub struct TableLookup {
    /// Unique ids in first-seen order.
    pub unique: Vec<u64>,
    /// For every position of `batch.ids`, its position in `unique` (`u32::MAX` where the id's
    /// slot is not looked up in this table); empty when no slot is.
    pub index: Vec<u32>,
    /// Per unique id, its shows (occurrences in the batch) and clicks (the click label summed
    /// over those occurrences): what the servers' row statistics count.
    pub counts: Vec<f32>,
}

/// A batch's ids made unique per table: the same id in two tables is two rows.
#[derive(Default)]
pub struct Lookups {
    map: HashMap<u64, u32, foldhash::fast::FixedState>,
    /// One per model table.
    pub tables: Vec<TableLookup>,
}

impl Lookups {
    /// Deduplicates the ids of `batch` for each table; `table_slots[t][s]` says whether slot
    /// `s` is looked up in table `t`; `click` is the label column of clicks (see
    /// [`crate::model::Model::click_column`]).
    pub fn run(&mut self, batch: &Batch, table_slots: &[Vec<bool>], click: Option<usize>) {
        self.dedup(batch, table_slots);
        let width = batch.label_width;
        let click = click.filter(|&c| c < width);
        for (t, slots) in self.tables.iter_mut().zip(table_slots) {
            t.counts.clear();
            t.counts.resize(2 * t.unique.len(), 0.0);
            if t.index.is_empty() {
                continue;
            }
            for k in (0..batch.len() * batch.slots).filter(|k| slots[k % batch.slots]) {
                let clicked = click.map_or(0.0, |c| batch.labels[(k / batch.slots) * width + c]);
                for i in batch.bag(k) {
                    let at = t.index[i] as usize;
                    t.counts[2 * at] += 1.0;
                    t.counts[2 * at + 1] += clicked;
                }
            }
        }
    }

    fn dedup(&mut self, batch: &Batch, table_slots: &[Vec<bool>]) {
        self.tables.resize_with(table_slots.len(), TableLookup::default);
        for (t, slots) in self.tables.iter_mut().zip(table_slots) {
            t.unique.clear();
            t.index.clear();
            if !slots.iter().any(|&s| s) {
                continue;
            }
            self.map.clear();
            let map = &mut self.map;
            let mut add = |id: u64, unique: &mut Vec<u64>| {
                let next = unique.len() as u32;
                let at = *map.entry(id).or_insert(next);
                if at == next {
                    unique.push(id);
                }
                at
            };
            if slots.iter().all(|&s| s) {
                for &id in &batch.ids {
                    let at = add(id, &mut t.unique);
                    t.index.push(at);
                }
                continue;
            }
            t.index.resize(batch.ids.len(), u32::MAX);
            for k in 0..batch.len() * batch.slots {
                if slots[k % batch.slots] {
                    for i in batch.bag(k) {
                        t.index[i] = add(batch.ids[i], &mut t.unique);
                    }
                }
            }
        }
    }

    /// Every table's unique ids, as a pull names them (`dims[t]` floats per row).
    pub fn ids<'a>(&'a self, dims: &[usize]) -> Vec<TableIds<'a>> {
        self.tables
            .iter()
            .enumerate()
            .map(|(t, l)| TableIds { table: t as u32, dim: dims[t], ids: &l.unique })
            .collect()
    }

    /// Every table's unique ids, owned (for the communication thread).
    pub fn unique_ids(&self) -> Vec<Vec<u64>> {
        self.tables.iter().map(|t| t.unique.clone()).collect()
    }

    /// Every table's index with its pulled `rows`, as the model reads them.
    pub fn rows<'a>(&'a self, rows: &'a [Vec<f32>]) -> Vec<TableRows<'a>> {
        self.tables.iter().zip(rows).map(|(l, r)| TableRows { index: &l.index, rows: r }).collect()
    }

    /// Every table's unique ids with their gradient sums, as a push sends them.
    pub fn grads<'a>(&'a self, dims: &[usize], grads: &'a [Vec<f32>]) -> Vec<TableGrads<'a>> {
        self.tables
            .iter()
            .zip(grads)
            .enumerate()
            .map(|(t, (l, g))| TableGrads {
                table: t as u32,
                dim: dims[t],
                ids: &l.unique,
                counts: &l.counts,
                grads: g,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_table_dedups_only_its_slots_and_keeps_first_seen_order() {
        let mut b = Batch::new(1, 0, 2);
        b.labels.extend([1.0, 0.0]);
        b.push_bag(&[5], None);
        b.push_bag(&[7, 5], None);
        b.push_bag(&[7], None);
        b.push_bag(&[], None);
        let mut l = Lookups::default();
        l.run(&b, &[vec![true, true], vec![false, true], vec![false, false]], Some(0));
        assert_eq!((l.tables[0].unique.clone(), l.tables[0].index.clone()), (vec![5, 7], vec![0, 1, 0, 1]));
        assert_eq!(l.tables[1].unique, [7, 5], "slot 1's ids only");
        assert_eq!(l.tables[1].index, [u32::MAX, 0, 1, u32::MAX]);
        assert!(l.tables[2].unique.is_empty() && l.tables[2].index.is_empty());
        // Sample 0 (clicked) has 5 then 7, 5; sample 1 (not clicked) has 7.
        assert_eq!(l.tables[0].counts, [2.0, 2.0, 2.0, 1.0], "5: shown twice, clicked twice; 7: twice, once");
        assert_eq!(l.tables[1].counts, [1.0, 1.0, 1.0, 1.0]);
        l.run(&b, &[vec![true, true], vec![false, true], vec![false, false]], None);
        assert_eq!(l.tables[0].counts, [2.0, 0.0, 2.0, 0.0], "no click column: shows only");
    }
}
