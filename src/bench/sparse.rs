//! `oar bench` (b): the sparse table through one server (of this build, and of baseline builds
//! given by path, `--baseline-exe`) beside the same table in memory, and the memory a row takes.
//! The servers are measured in alternating rounds (`--rounds`), so a drift of the machine
//! between rounds cancels, and ratios are paired by round.

use std::path::Path;
use std::time::Instant;

use super::cores::{Pinned, Placement};
use super::{connect, in_turn, median, one_sample, ServerProc};
use crate::client::{StepHeader, TableGrads, TableIds};
use crate::protocol::RowCreation;
use crate::table::{DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

/// One server build's sparse figures.
pub(super) struct BuildRates {
    /// Which build: "this build", or the baseline binary's path.
    pub(super) name: String,
    /// New ids per second, pulled into the per-dimension Adagrad table.
    pub(super) insert: f64,
    /// The server's resident memory grown by the inserts, per row: per-dimension Adagrad
    /// (`std_adagrad`-like, 10 floats of state) and row-wise Adagrad (`SparseAdaGradSGDRule`).
    pub(super) bytes_per_row: [f64; 2],
    /// Pull as drawn, pull unique, push unique: (keys per wall second, keys per server CPU
    /// second, the share of the wall time the server spent in its handler: reading or updating
    /// the table, by its own count; 0 for a build that does not count it), medians of the
    /// alternating rounds.
    pub(super) ops: [(f64, f64, f64); 3],
    /// The same, keys per wall second in each round, for ratios paired by round.
    pub(super) per_round: [Vec<f64>; 3],
}

impl BuildRates {
    /// This build's rate of `op` over `other`'s, round by round (each round measures both one
    /// after the other, so a drift of the machine between rounds cancels): the median and the
    /// least and greatest.
    pub(super) fn ratios(&self, other: &BuildRates, op: usize) -> (f64, f64, f64) {
        let r: Vec<f64> = self.per_round[op].iter().zip(&other.per_round[op]).map(|(a, b)| a / b).collect();
        spread(r)
    }
}

/// Sparse results: every build's figures through a server, and this build's table in memory.
pub(super) struct SparseRates {
    pub(super) unique: usize,
    pub(super) builds: Vec<BuildRates>,
    /// Insert, pull as drawn, pull unique, push unique on this build's table in memory.
    pub(super) mem: [f64; 4],
    /// Pull as drawn, pull unique, push unique in memory, keys per second in each round.
    pub(super) mem_per_round: [Vec<f64>; 3],
    /// Where the server and the client ran, if placed on cores of their own.
    pub(super) placement: Option<Placement>,
}

impl SparseRates {
    /// A build's rate of `op` through its server as a share of the table in memory, round by
    /// round (each round measures both, so a drift of the machine cancels): the median and
    /// the least and greatest.
    pub(super) fn of_memory(&self, build: &BuildRates, op: usize) -> (f64, f64, f64) {
        let r: Vec<f64> = build.per_round[op].iter().zip(&self.mem_per_round[op]).map(|(a, b)| a / b).collect();
        spread(r)
    }
}

/// The median, least and greatest of `r`.
fn spread(r: Vec<f64>) -> (f64, f64, f64) {
    let (lo, hi) = r.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
    (median(r), lo, hi)
}

/// The keys the sparse measurements use: `rows` distinct ids in insert batches of `keys`, and 64
/// batches of `keys` ids with log-uniform ranks (Zipf-like, s = 1), as drawn and deduplicated.
/// `oar bench` (b) and `cargo bench --bench sparse_table` draw the same.
pub struct SparseDraws {
    /// Every id once, in batches.
    pub inserts: Vec<Vec<u64>>,
    /// Batches as drawn (with repeats).
    pub drawn: Vec<Vec<u64>>,
    /// The drawn batches deduplicated in first-seen order (what a trainer sends).
    pub unique: Vec<Vec<u64>>,
}

impl SparseDraws {
    /// The draws for a table of `rows` ids and requests of `keys` ids.
    pub fn new(rows: usize, keys: usize) -> SparseDraws {
        let key = |rank: u64| crate::base::layout::mix64(rank ^ 0x5eed);
        let inserts: Vec<Vec<u64>> =
            (0..rows as u64).collect::<Vec<_>>().chunks(keys).map(|c| c.iter().map(|&r| key(r)).collect()).collect();
        let drawn: Vec<Vec<u64>> = (0..64u64)
            .map(|b| {
                (0..keys as u64)
                    .map(|i| {
                        let u = (crate::base::layout::mix64(b << 32 | i) >> 11) as f64 / (1u64 << 53) as f64;
                        key(((u * (rows as f64).ln()).exp() as u64).min(rows as u64 - 1))
                    })
                    .collect()
            })
            .collect();
        // In first-seen order, as a trainer deduplicates (`train::store`): sorted ids would
        // visit a layout that places rows by id in address order, which no trainer's pull does.
        let unique = drawn
            .iter()
            .map(|d| {
                let mut seen = hashbrown::HashSet::with_capacity(d.len());
                d.iter().copied().filter(|&id| seen.insert(id)).collect()
            })
            .collect();
        SparseDraws { inserts, drawn, unique }
    }
}

/// A measured server: its process, a trainer's connection, and its rounds so far.
struct Measured {
    server: ServerProc,
    client: crate::client::Client,
    rates: BuildRates,
    rounds: [Vec<(f64, f64, f64)>; 3],
    step: u64,
}

/// Seconds the server of `client` has spent handling pulls and pushes, by its own count.
fn handled(client: &mut crate::client::Client) -> anyhow::Result<(f64, f64)> {
    let stats = client.stats()?;
    Ok((stats.iter().map(|s| s.pull_seconds).sum(), stats.iter().map(|s| s.push_seconds).sum()))
}

/// `timed`'s rates and the share of its wall time the server handled requests (`before` and
/// `after`: its pull or push seconds around the run).
fn with_share((rate, cpu, wall): (f64, f64, f64), before: f64, after: f64) -> (f64, f64, f64) {
    (rate, cpu, (after - before) / wall.max(1e-9))
}

/// What every measurement of (b) uses: the tables, the batches, and the gradients pushed.
struct Work {
    spec: TableSpec,
    rows: usize,
    /// Ids a drawn batch holds.
    keys: usize,
    draws: SparseDraws,
    grads: Vec<f32>,
    counts: Vec<f32>,
    seconds: f64,
}

/// Sparse figures, as in `../shared/research/deps.md`: `rows` keys inserted into a dim-10 table
/// of each Adagrad layout, then batches of `keys` ids with log-uniform ranks (Zipf-like, s = 1),
/// deduplicated, pulled and pushed through one server of this build and of each `baselines`
/// binary (same protocol) and on this build's table in memory, in alternating rounds. With a
/// `placement`, every server runs on its core and the client and the table in memory on theirs.
pub(super) fn sparse_rates(
    exe: &Path,
    baselines: &[std::path::PathBuf],
    (rows, keys): (usize, usize),
    seconds: f64,
    rounds: usize,
    placement: Option<Placement>,
) -> anyhow::Result<SparseRates> {
    // A thread that cannot be placed (a seccomp filter, a cgroup) measures where it runs.
    let (placement, _pinned) = match placement.map(|p| (p, Pinned::on(p.client))) {
        Some((p, Ok(pinned))) => (Some(p), Some(pinned)),
        Some((_, Err(e))) => {
            tracing::warn!("cannot place the benchmark on cores of its own ({e}): the scheduler places it");
            (None, None)
        }
        None => (None, None),
    };
    let table = SparseSpec::new("emb", 10, 1, Init::Uniform { scale: 0.01 }, Optimizer::adagrad(0.05));
    let row_wise = SparseSpec::new(
        "emb_rw",
        10,
        1,
        Init::Uniform { scale: 0.01 },
        Optimizer::paddle(crate::table::OptimizerKind::SparseAdagrad),
    );
    let spec = TableSpec {
        dense: DenseSpec { params: vec![], block_size: 1024, seed: 1, optimizer: Optimizer::sgd(0.1) },
        sparse: vec![table.clone(), row_wise],
    };
    let work = Work {
        spec,
        rows,
        keys,
        draws: SparseDraws::new(rows, keys),
        grads: vec![0.01f32; keys * 10],
        counts: [1.0f32, 0.0].repeat(keys),
        seconds,
    };
    let exes = std::iter::once(("this build".to_string(), exe.to_path_buf()))
        .chain(baselines.iter().map(|b| (format!("baseline {}", b.display()), b.clone())));
    let mut measured = Vec::new();
    for (name, exe) in exes {
        measured.push(start_and_fill(name, &exe, &work, placement.map(|p| p.server))?);
    }
    let mut memory = InMemory::filled(table, &work)?;
    // Rounds each measuring every build in turn and the table in memory, so drifts of the
    // machine hit all alike; each round starts at the next build, and the table in memory goes
    // first every other round, as the first one measured ran about 5% slower.
    let n = measured.len();
    for round in 0..rounds.max(1) {
        let memory_first = round % 2 == 1;
        let servers = |measure: fn(&mut Measured, &Work) -> anyhow::Result<()>, measured: &mut [Measured]| {
            (0..n).try_for_each(|k| measure(&mut measured[(round + k) % n], &work))
        };
        in_turn(memory_first, || servers(measure_pulls, &mut measured), || memory.pulls(&work))?;
        in_turn(memory_first, || servers(measure_pushes, &mut measured), || memory.pushes(&work))?;
    }
    let mut builds = Vec::new();
    for mut m in measured {
        for (k, r) in m.rounds.iter().enumerate() {
            let mid = |f: fn(&(f64, f64, f64)) -> f64| median(r.iter().map(f).collect());
            m.rates.ops[k] = (mid(|r| r.0), mid(|r| r.1), mid(|r| r.2));
            m.rates.per_round[k] = r.iter().map(|r| r.0).collect();
        }
        m.client.close(0)?;
        m.server.stop();
        builds.push(m.rates);
    }
    let unique = work.draws.unique.iter().map(Vec::len).sum::<usize>() / work.draws.unique.len().max(1);
    let m = |k: usize| median(memory.per_round[k].clone());
    let mem = [memory.insert, m(0), m(1), m(2)];
    Ok(SparseRates { unique, builds, mem, mem_per_round: memory.per_round, placement })
}

/// Starts a server of `exe` (on core `cpu` if given) and inserts every row into both its
/// tables, measuring the inserts and the memory a row takes.
fn start_and_fill(name: String, exe: &Path, work: &Work, cpu: Option<usize>) -> anyhow::Result<Measured> {
    let server = ServerProc::start_on(exe, &[], cpu)?;
    let mut client = connect(&server.addr, &work.spec)?;
    let mut out = [Vec::new()];
    let (mut bytes_per_row, mut insert) = ([0.0; 2], 0.0);
    for (t, bytes) in bytes_per_row.iter_mut().enumerate() {
        let mut pull = |ids: &[u64]| {
            client.pull(None, &[TableIds { table: t as u32, dim: 10, ids }], &mut out, RowCreation::Create)?;
            anyhow::Ok(())
        };
        let before = server.rss_bytes()?;
        let rate = timed(&mut pull, &work.draws.inserts, true, work.seconds, &|| server.cpu_seconds())?.0;
        *bytes = server.rss_bytes()?.saturating_sub(before) as f64 / work.rows.max(1) as f64;
        if t == 0 {
            insert = rate;
        }
    }
    let rates = BuildRates { name, insert, bytes_per_row, ops: Default::default(), per_round: Default::default() };
    Ok(Measured { server, client, rates, rounds: Default::default(), step: 0 })
}

/// One round's pulls through `m`'s server: the batches as drawn, then deduplicated.
fn measure_pulls(m: &mut Measured, work: &Work) -> anyhow::Result<()> {
    let mut out = [Vec::new()];
    for (op, sets) in [(0, &work.draws.drawn), (1, &work.draws.unique)] {
        let before = handled(&mut m.client)?.0;
        let (client, server) = (&mut m.client, &m.server);
        let mut pull = |ids: &[u64]| {
            client.pull(None, &[TableIds { table: 0, dim: 10, ids }], &mut out, RowCreation::Create)?;
            anyhow::Ok(())
        };
        let r = timed(&mut pull, sets, false, work.seconds, &|| server.cpu_seconds())?;
        m.rounds[op].push(with_share(r, before, handled(&mut m.client)?.0));
    }
    Ok(())
}

/// One round's pushes of the deduplicated batches through `m`'s server.
fn measure_pushes(m: &mut Measured, work: &Work) -> anyhow::Result<()> {
    let before = handled(&mut m.client)?.1;
    let (client, server, step) = (&mut m.client, &m.server, &mut m.step);
    // Each push its own step: servers answer a step sent again without applying it.
    let mut push = |ids: &[u64]| {
        let (counts, grads) = (&work.counts[..ids.len() * 2], &work.grads[..ids.len() * 10]);
        let g = TableGrads { table: 0, dim: 10, ids, counts, grads };
        client.push(&StepHeader { step: *step, ..one_sample() }, None, &[g])?;
        *step += 1;
        anyhow::Ok(())
    };
    let r = timed(&mut push, &work.draws.unique, false, work.seconds, &|| server.cpu_seconds())?;
    m.rounds[2].push(with_share(r, before, handled(&mut m.client)?.1));
    Ok(())
}

/// This build's table in memory, measured by the same batches on the measuring thread.
struct InMemory {
    table: crate::table::SparseTable,
    rows_out: Vec<f32>,
    insert: f64,
    per_round: [Vec<f64>; 3],
}

impl InMemory {
    /// The table with every row inserted (the inserts measured).
    fn filled(spec: SparseSpec, work: &Work) -> anyhow::Result<InMemory> {
        let mut m = InMemory {
            table: crate::table::SparseTable::new(spec),
            rows_out: vec![0.0; work.keys * 10],
            insert: 0.0,
            per_round: Default::default(),
        };
        m.insert = m.timed_pulls(&work.draws.inserts, true, work.seconds)?;
        Ok(m)
    }

    fn timed_pulls(&mut self, sets: &[Vec<u64>], once: bool, seconds: f64) -> anyhow::Result<f64> {
        let (table, out) = (&self.table, &mut self.rows_out);
        let mut pull = |ids: &[u64]| Ok(table.pull(ids, &mut out[..ids.len() * 10], true)?);
        Ok(timed(&mut pull, sets, once, seconds, &|| Ok(f64::NAN))?.0)
    }

    /// One round's pulls, as drawn and deduplicated.
    fn pulls(&mut self, work: &Work) -> anyhow::Result<()> {
        let drawn = self.timed_pulls(&work.draws.drawn, false, work.seconds)?;
        let unique = self.timed_pulls(&work.draws.unique, false, work.seconds)?;
        self.per_round[0].push(drawn);
        self.per_round[1].push(unique);
        Ok(())
    }

    /// One round's pushes of the deduplicated batches.
    fn pushes(&mut self, work: &Work) -> anyhow::Result<()> {
        let table = &self.table;
        let mut push =
            |ids: &[u64]| Ok(table.push(ids, &work.counts[..ids.len() * 2], &work.grads[..ids.len() * 10], 1.0)?);
        self.per_round[2].push(timed(&mut push, &work.draws.unique, false, work.seconds, &|| Ok(f64::NAN))?.0);
        Ok(())
    }
}

/// Runs `op` over `sets` (each once if `once`, else round and round for a quarter of `seconds`,
/// at least 3), returning (keys per wall second, keys per `cpu` second, wall seconds).
fn timed(
    op: &mut dyn FnMut(&[u64]) -> anyhow::Result<()>,
    sets: &[Vec<u64>],
    once: bool,
    seconds: f64,
    cpu: &dyn Fn() -> anyhow::Result<f64>,
) -> anyhow::Result<(f64, f64, f64)> {
    let (started, cpu0, mut n, mut i) = (Instant::now(), cpu()?, 0usize, 0usize);
    while if once { i < sets.len() } else { started.elapsed().as_secs_f64() < seconds / 4.0 || i < 3 } {
        let ids = &sets[i % sets.len()];
        op(ids)?;
        n += ids.len();
        i += 1;
    }
    let (wall, busy) = (started.elapsed().as_secs_f64(), cpu()? - cpu0);
    anyhow::Ok((n as f64 / wall, n as f64 / busy.max(1e-3), wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_batches_keep_first_seen_order_as_a_trainer_sends_them() {
        let d = SparseDraws::new(1000, 400);
        for (drawn, unique) in d.drawn.iter().zip(&d.unique) {
            let mut seen = std::collections::HashSet::new();
            let first: Vec<u64> = drawn.iter().copied().filter(|&id| seen.insert(id)).collect();
            assert_eq!(unique, &first);
            assert!(unique.len() < drawn.len(), "Zipf draws repeat ids");
        }
    }

    #[test]
    fn ratios_are_paired_by_round() {
        let build = |per_round: Vec<f64>| BuildRates {
            name: String::new(),
            insert: 0.0,
            bytes_per_row: [0.0; 2],
            ops: Default::default(),
            per_round: [per_round, vec![], vec![]],
        };
        // A machine that slows down round by round: each round's pair keeps the 1.1x, where the
        // two builds' medians (20 against 20) would show none.
        let (this, base) = (build(vec![11.0, 22.0, 33.0]), build(vec![10.0, 20.0, 30.0]));
        let (mid, lo, hi) = this.ratios(&base, 0);
        assert!((mid - 1.1).abs() < 1e-9 && (lo - 1.1).abs() < 1e-9 && (hi - 1.1).abs() < 1e-9);
        let this = build(vec![9.0, 24.0, 36.0]);
        let (mid, lo, hi) = this.ratios(&base, 0);
        assert_eq!((mid, lo, hi), (1.2, 0.9, 1.2));
    }
}
