//! `oar bench` (b): the sparse table through one server beside the same table in memory, and
//! the memory a row takes.

use std::path::Path;
use std::time::Instant;

use super::{connect, median, one_sample, ServerProc};
use crate::client::{StepHeader, TableGrads, TableIds};
use crate::protocol::RowCreation;
use crate::table::{DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

/// Sparse figures, as in `../shared/research/deps.md`: `rows` keys inserted first, then
/// batches of `keys` ids with log-uniform ranks (Zipf-like, s = 1), deduplicated. Returns
/// [insert, pull, push] keys/s through one server and the same three on the in-memory table.
/// Sparse results: per operation (name, keys/s through a server, keys/s in memory, keys per
/// server CPU second).
pub(super) struct SparseRates {
    pub(super) unique: usize,
    /// The server's resident memory grown by the inserts, per row inserted.
    pub(super) bytes_per_row: f64,
    pub(super) rows: Vec<(String, f64, f64, f64)>,
}

pub(super) fn sparse_rates(exe: &Path, rows: usize, keys: usize, seconds: f64) -> anyhow::Result<SparseRates> {
    let table = SparseSpec::new("emb", 10, 1, Init::Uniform { scale: 0.01 }, Optimizer::adagrad(0.05));
    let spec = TableSpec {
        dense: DenseSpec { params: vec![], block_size: 1024, seed: 1, optimizer: Optimizer::sgd(0.1) },
        sparse: vec![table.clone()],
    };
    let key = |rank: u64| crate::layout::mix64(rank ^ 0x5eed);
    let inserts: Vec<Vec<u64>> =
        (0..rows as u64).collect::<Vec<_>>().chunks(keys).map(|c| c.iter().map(|&r| key(r)).collect()).collect();
    let drawn: Vec<Vec<u64>> = (0..64u64)
        .map(|b| {
            (0..keys as u64)
                .map(|i| {
                    let u = (crate::layout::mix64(b << 32 | i) >> 11) as f64 / (1u64 << 53) as f64;
                    key(((u * (rows as f64).ln()).exp() as u64).min(rows as u64 - 1))
                })
                .collect()
        })
        .collect();
    let batches: Vec<Vec<u64>> = drawn
        .iter()
        .map(|d| {
            let mut v = d.clone();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let grads = vec![0.01f32; keys * 10];
    let counts = [1.0f32, 0.0].repeat(keys);
    // Returns (keys per wall second, keys per server CPU second).
    let timed = |op: &mut dyn FnMut(&[u64]) -> anyhow::Result<()>,
                 sets: &[Vec<u64>],
                 once: bool,
                 cpu: &dyn Fn() -> anyhow::Result<f64>| {
        let (started, cpu0, mut n, mut i) = (Instant::now(), cpu()?, 0usize, 0usize);
        while if once { i < sets.len() } else { started.elapsed().as_secs_f64() < seconds / 4.0 || i < 3 } {
            let ids = &sets[i % sets.len()];
            op(ids)?;
            n += ids.len();
            i += 1;
        }
        let (wall, busy) = (started.elapsed().as_secs_f64(), cpu()? - cpu0);
        anyhow::Ok((n as f64 / wall, n as f64 / busy.max(1e-3)))
    };
    let server = ServerProc::start(exe)?;
    let server_cpu = || server.cpu_seconds();
    let no_cpu = || Ok(f64::NAN);
    let mut c = connect(&server.addr, &spec)?;
    let mut out = [Vec::new()];
    let mut pull = |ids: &[u64]| {
        c.pull(None, &[TableIds { table: 0, dim: 10, ids }], &mut out, RowCreation::Create)?;
        anyhow::Ok(())
    };
    let before = server.rss_bytes()?;
    let (net_insert, _) = timed(&mut pull, &inserts, true, &server_cpu)?;
    let bytes_per_row = server.rss_bytes()?.saturating_sub(before) as f64 / rows.max(1) as f64;
    // Three alternating rounds of each measurement; the medians are reported.
    let mut net: [Vec<(f64, f64)>; 3] = Default::default();
    for _ in 0..3 {
        net[0].push(timed(&mut pull, &drawn, false, &server_cpu)?);
        net[1].push(timed(&mut pull, &batches, false, &server_cpu)?);
    }
    // Each push its own step: servers answer a step sent again without applying it.
    let mut step = 0;
    for _ in 0..3 {
        let mut push = |ids: &[u64]| {
            let (counts, grads) = (&counts[..ids.len() * 2], &grads[..ids.len() * 10]);
            let g = TableGrads { table: 0, dim: 10, ids, counts, grads };
            step += 1;
            c.push(&StepHeader { step, ..one_sample() }, None, &[g])?;
            anyhow::Ok(())
        };
        net[2].push(timed(&mut push, &batches, false, &server_cpu)?);
    }
    c.close(0)?;
    server.stop();
    let mem = crate::table::SparseTable::new(table);
    let mut rows_out = vec![0.0f32; keys * 10];
    let mut mem_pull = |ids: &[u64]| Ok(mem.pull(ids, &mut rows_out[..ids.len() * 10], true)?);
    let (mem_insert, _) = timed(&mut mem_pull, &inserts, true, &no_cpu)?;
    let mut mem_rates: [Vec<f64>; 3] = Default::default();
    for _ in 0..3 {
        mem_rates[0].push(timed(&mut mem_pull, &drawn, false, &no_cpu)?.0);
        mem_rates[1].push(timed(&mut mem_pull, &batches, false, &no_cpu)?.0);
    }
    for _ in 0..3 {
        let mut mem_push = |ids: &[u64]| Ok(mem.push(ids, &counts[..ids.len() * 2], &grads[..ids.len() * 10], 1.0)?);
        mem_rates[2].push(timed(&mut mem_push, &batches, false, &no_cpu)?.0);
    }
    let wall = |k: usize| median(net[k].iter().map(|r| r.0).collect());
    let core = |k: usize| median(net[k].iter().map(|r| r.1).collect());
    let mem = |k: usize| median(mem_rates[k].clone());
    let unique = batches.iter().map(Vec::len).sum::<usize>() / batches.len();
    Ok(SparseRates {
        unique,
        bytes_per_row,
        rows: vec![
            ("insert (new ids)".into(), net_insert, mem_insert, f64::NAN),
            (format!("pull {keys} ids as drawn"), wall(0), mem(0), core(0)),
            (format!("pull {unique} unique ids"), wall(1), mem(1), core(1)),
            (format!("push {unique} unique ids"), wall(2), mem(2), core(2)),
        ],
    })
}
