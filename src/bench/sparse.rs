//! `oar bench` (b): the sparse table through one server (of this build, and of baseline builds
//! given by path, `--baseline-exe`) beside the same table in memory, and the memory a row takes.
//! The servers are measured in alternating rounds (`--rounds`), so a drift of the machine
//! between rounds cancels, and ratios are paired by round.

use std::path::Path;
use std::time::Instant;

use super::{connect, median, one_sample, ServerProc};
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
        let (lo, hi) = r.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        (median(r), lo, hi)
    }
}

/// Sparse results: every build's figures through a server, and this build's table in memory.
pub(super) struct SparseRates {
    pub(super) unique: usize,
    pub(super) builds: Vec<BuildRates>,
    /// Insert, pull as drawn, pull unique, push unique on this build's table in memory.
    pub(super) mem: [f64; 4],
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

/// Sparse figures, as in `../shared/research/deps.md`: `rows` keys inserted into a dim-10 table
/// of each Adagrad layout, then batches of `keys` ids with log-uniform ranks (Zipf-like, s = 1),
/// deduplicated, pulled and pushed through one server of this build and of each `baselines`
/// binary (same protocol), in alternating rounds; then this build's table in memory.
pub(super) fn sparse_rates(
    exe: &Path,
    baselines: &[std::path::PathBuf],
    rows: usize,
    keys: usize,
    seconds: f64,
    rounds: usize,
) -> anyhow::Result<SparseRates> {
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
    let SparseDraws { inserts, drawn, unique: batches } = SparseDraws::new(rows, keys);
    let grads = vec![0.01f32; keys * 10];
    let counts = [1.0f32, 0.0].repeat(keys);
    let mut out = [Vec::new()];
    let mut measured = Vec::new();
    let exes = std::iter::once(("this build".to_string(), exe.to_path_buf()))
        .chain(baselines.iter().map(|b| (format!("baseline {}", b.display()), b.clone())));
    for (name, exe) in exes {
        let server = ServerProc::start(&exe)?;
        let mut client = connect(&server.addr, &spec)?;
        let mut bytes_per_row = [0.0; 2];
        let mut insert = 0.0;
        for (t, bytes) in bytes_per_row.iter_mut().enumerate() {
            let mut pull = |ids: &[u64]| {
                client.pull(None, &[TableIds { table: t as u32, dim: 10, ids }], &mut out, RowCreation::Create)?;
                anyhow::Ok(())
            };
            let before = server.rss_bytes()?;
            let rate = timed(&mut pull, &inserts, true, seconds, &|| server.cpu_seconds())?.0;
            *bytes = server.rss_bytes()?.saturating_sub(before) as f64 / rows.max(1) as f64;
            if t == 0 {
                insert = rate;
            }
        }
        let rates = BuildRates { name, insert, bytes_per_row, ops: Default::default(), per_round: Default::default() };
        measured.push(Measured { server, client, rates, rounds: Default::default(), step: 0 });
    }
    // Rounds each measuring every build in turn, so drifts of the machine hit all alike; each
    // round starts at the next build, as the first one measured ran about 5% slower.
    let n = measured.len();
    for round in 0..rounds.max(1) {
        for k in 0..n {
            let m = &mut measured[(round + k) % n];
            for (op, sets) in [(0, &drawn), (1, &batches)] {
                let before = handled(&mut m.client)?.0;
                let (client, server) = (&mut m.client, &m.server);
                let mut pull = |ids: &[u64]| {
                    client.pull(None, &[TableIds { table: 0, dim: 10, ids }], &mut out, RowCreation::Create)?;
                    anyhow::Ok(())
                };
                let r = timed(&mut pull, sets, false, seconds, &|| server.cpu_seconds())?;
                m.rounds[op].push(with_share(r, before, handled(&mut m.client)?.0));
            }
        }
        for k in 0..n {
            let m = &mut measured[(round + k) % n];
            let before = handled(&mut m.client)?.1;
            let (client, server, step) = (&mut m.client, &m.server, &mut m.step);
            // Each push its own step: servers answer a step sent again without applying it.
            let mut push = |ids: &[u64]| {
                let (counts, grads) = (&counts[..ids.len() * 2], &grads[..ids.len() * 10]);
                let g = TableGrads { table: 0, dim: 10, ids, counts, grads };
                client.push(&StepHeader { step: *step, ..one_sample() }, None, &[g])?;
                *step += 1;
                anyhow::Ok(())
            };
            let r = timed(&mut push, &batches, false, seconds, &|| server.cpu_seconds())?;
            m.rounds[2].push(with_share(r, before, handled(&mut m.client)?.1));
        }
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
    let no_cpu = || Ok(f64::NAN);
    let mem = crate::table::SparseTable::new(table);
    let mut rows_out = vec![0.0f32; keys * 10];
    let mut mem_pull = |ids: &[u64]| Ok(mem.pull(ids, &mut rows_out[..ids.len() * 10], true)?);
    let mem_insert = timed(&mut mem_pull, &inserts, true, seconds, &no_cpu)?.0;
    let mut mem_rates: [Vec<f64>; 3] = Default::default();
    for _ in 0..3 {
        mem_rates[0].push(timed(&mut mem_pull, &drawn, false, seconds, &no_cpu)?.0);
        mem_rates[1].push(timed(&mut mem_pull, &batches, false, seconds, &no_cpu)?.0);
    }
    for _ in 0..3 {
        let mut mem_push = |ids: &[u64]| Ok(mem.push(ids, &counts[..ids.len() * 2], &grads[..ids.len() * 10], 1.0)?);
        mem_rates[2].push(timed(&mut mem_push, &batches, false, seconds, &no_cpu)?.0);
    }
    let m = |k: usize| median(mem_rates[k].clone());
    let unique = batches.iter().map(Vec::len).sum::<usize>() / batches.len();
    Ok(SparseRates { unique, builds, mem: [mem_insert, m(0), m(1), m(2)] })
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
