//! Base and delta saves against a fresh look at the table, over random sequences of pushes
//! (admission, capacity evictions), shrinks (decay across `base_threshold` and
//! `embedx_threshold`, deletions), saves and server restarts through a checkpoint file: the
//! rows a serving system holds after applying the saves in order (a base replaces, a delta
//! deletes its removed ids then writes its rows) are always the rows a base saved at that
//! moment would hold.

use std::collections::BTreeMap;

use crate::base::layout::mix64;
use crate::persist::export::collect;
use crate::protocol::ExportKind;
use crate::table::accessor::Accessor;
use crate::table::admit::Entry;
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, Shard, SparseSpec, TableExport, TableSpec};

const DIM: usize = 3;

/// A small random source: the splitmix finalizer over a counter.
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 += 1;
        mix64(self.0) % n
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
}

fn spec(d: &mut Draws) -> TableSpec {
    let accessor = Accessor {
        show_click_decay_rate: d.pick(&[0.5, 0.8, 1.0]),
        delete_threshold: d.pick(&[0.0, 0.15, 0.3]),
        delete_after_unseen_days: d.pick(&[2.0, 5.0, 30.0]),
        base_threshold: d.pick(&[0.0, 0.5, 1.5]),
        embedx_threshold: d.pick(&[0.0, 1.0, 3.0]),
        // Paddle's rule keeps rows unseen this long out of deltas even when a shrink changed
        // them; a window longer than any row lives here leaves it out of the comparison.
        delta_keep_days: 10_000.0,
        ..Accessor::default()
    };
    let sparse = SparseSpec {
        accessor,
        entry: d.pick(&[Entry::All, Entry::Count(2)]),
        capacity: d.pick(&[None, Some(64 * 6)]),
        ..SparseSpec::new("emb", DIM, 7, Init::Uniform { scale: 0.1 }, Optimizer::adagrad(0.1))
    };
    let dense = DenseSpec {
        params: vec![DenseParam::new("w", 4, Init::Uniform { scale: 0.1 })],
        block_size: 4,
        seed: 1,
        optimizer: Optimizer::sgd(0.1),
    };
    TableSpec { dense, sparse: vec![sparse] }
}

/// What a base saved now would hold, read without saving (a save restarts the delta scores).
fn fresh_base(shard: &Shard) -> BTreeMap<u64, Vec<f32>> {
    let t = &shard.sparse[0];
    let accessor = &t.spec().accessor;
    let mut rows = BTreeMap::new();
    t.for_each_row(|id, row| {
        let stats = &row[DIM..];
        if accessor.in_base(stats) {
            let mut w = row[..DIM].to_vec();
            if !accessor.embedx_live(stats) {
                w[1..].fill(0.0);
            }
            rows.insert(id, w);
        }
    });
    rows
}

fn apply(served: &mut BTreeMap<u64, Vec<f32>>, kind: ExportKind, e: &TableExport) {
    if kind == ExportKind::Base {
        served.clear();
    }
    for id in &e.deleted {
        served.remove(id);
    }
    served.extend(e.ids.iter().zip(e.weights.chunks_exact(DIM)).map(|(&id, w)| (id, w.to_vec())));
}

/// One random run: returns how many deltas and restarts it went through.
fn run(seed: u64, steps: usize) -> (usize, usize) {
    let mut d = Draws(seed << 32);
    let dir = tempfile::tempdir().unwrap();
    let mut shard = Shard::new(spec(&mut d), 0, 1);
    let (mut served, mut based) = (BTreeMap::new(), false);
    let (mut deltas, mut restarts) = (0, 0);
    for step in 0..steps {
        match d.below(10) {
            0..=5 => {
                let n = 1 + d.below(60) as usize;
                let ids: Vec<u64> = (0..n).map(|_| d.below(1500)).collect();
                let counts: Vec<f32> = ids.iter().flat_map(|_| [1.0 + d.below(3) as f32, d.below(2) as f32]).collect();
                let grads: Vec<f32> = (0..n * DIM).map(|_| d.below(200) as f32 / 100.0 - 1.0).collect();
                shard.sparse[0].push(&ids, &counts, &grads, 1.0).unwrap();
            }
            6 => {
                shard.sparse[0].shrink(d.below(3) as u32);
            }
            7 | 8 => {
                let asked = if based { ExportKind::Delta } else { ExportKind::Base };
                // A delta the shard cannot complete (restored, log outgrown) is a base, as the
                // trainer makes it.
                let (kind, tables) = match collect(&shard, asked) {
                    Some(t) => (asked, t),
                    None => (ExportKind::Base, collect(&shard, ExportKind::Base).unwrap()),
                };
                deltas += usize::from(kind == ExportKind::Delta);
                apply(&mut served, kind, &tables[0]);
                based = true;
                assert_eq!(served, fresh_base(&shard), "seed {seed}, step {step}: base + deltas against a base");
            }
            _ => {
                // A restart from a checkpoint file of the shard as it is now.
                let (name, _, _) = crate::persist::checkpoint::write_shard(&shard, dir.path()).unwrap();
                shard = crate::persist::checkpoint::read_shard(&dir.path().join(name)).unwrap();
                restarts += 1;
            }
        }
    }
    (deltas, restarts)
}

#[test]
fn base_and_deltas_equal_a_fresh_base_through_pushes_shrinks_evictions_and_restarts() {
    let (mut deltas, mut restarts) = (0, 0);
    for seed in 0..40 {
        let (d, r) = run(seed, 150);
        deltas += d;
        restarts += r;
    }
    assert!(deltas > 200 && restarts > 200, "the runs saved deltas ({deltas}) and restarted ({restarts})");
}
