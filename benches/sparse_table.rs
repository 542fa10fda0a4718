//! `cargo bench --bench sparse_table`: one server's sparse table in memory (no network), dim 10,
//! per-dimension Adagrad (`RULE=row_wise`: row-wise): 10M rows inserted (`ROWS` to change), then batches of 50,000
//! Zipf-like keys pulled as drawn, pulled deduplicated and pushed. Prints keys per second,
//! medians of 5 rounds. The draws are `oar bench` (b)'s ([`oar::bench::SparseDraws`]), so its
//! "in memory" figures and these measure the same work (they differ by this VM's run-to-run
//! noise); this one is quicker to run while working on the table.

use std::time::Instant;

use oar::bench::SparseDraws;
use oar::table::sparse::SparseTable;
use oar::table::{Init, Optimizer, OptimizerKind, SparseSpec};

fn main() {
    let rows: usize = std::env::var("ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000_000);
    let keys = 50_000usize;
    // `RULE=row_wise`: Paddle's row-wise Adagrad (one accumulator a row) instead.
    let optimizer = match std::env::var("RULE").as_deref() {
        Ok("row_wise") => Optimizer::paddle(OptimizerKind::SparseAdagrad),
        _ => Optimizer::adagrad(0.05),
    };
    let table = SparseTable::new(SparseSpec::new("emb", 10, 1, Init::Uniform { scale: 0.01 }, optimizer));
    let SparseDraws { inserts, drawn, unique } = SparseDraws::new(rows, keys);
    let mut out = vec![0.0f32; keys * 10];
    let started = Instant::now();
    for batch in &inserts {
        table.pull(batch, &mut out[..batch.len() * 10], true).expect("insert");
    }
    let insert = rows as f64 / started.elapsed().as_secs_f64();
    let grads = vec![0.01f32; keys * 10];
    let counts = [1.0f32, 0.0].repeat(keys);
    let rate = |op: &mut dyn FnMut(&[u64]), sets: &[Vec<u64>]| {
        let mut r: Vec<f64> = (0..5)
            .map(|_| {
                let (t, mut n) = (Instant::now(), 0);
                for s in sets {
                    op(s);
                    n += s.len();
                }
                n as f64 / t.elapsed().as_secs_f64() / 1e6
            })
            .collect();
        r.sort_by(f64::total_cmp);
        r[2]
    };
    let mut pull = |ids: &[u64]| table.pull(ids, &mut out[..ids.len() * 10], true).expect("pull");
    let drawn_rate = rate(&mut pull, &drawn);
    let unique_rate = rate(&mut pull, &unique);
    let mut push =
        |ids: &[u64]| table.push(ids, &counts[..ids.len() * 2], &grads[..ids.len() * 10], 1.0).expect("push");
    let push_rate = rate(&mut push, &unique);
    println!(
        "sparse table in memory, {rows} rows: insert {:.2}, pull as drawn {drawn_rate:.2}, pull unique {unique_rate:.2}, push unique {push_rate:.2} M keys/s",
        insert / 1e6
    );
}
