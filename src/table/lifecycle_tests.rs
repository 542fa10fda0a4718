//! Row lifecycle on one table, against hand-computed values: statistics, admission, capacity
//! eviction, shrink and the `embedx` threshold.

use super::accessor::Accessor;
use super::admit::Entry;
use super::{Init, Optimizer, SparseSpec, SparseTable};

fn spec() -> SparseSpec {
    SparseSpec::new("emb", 3, 9, Init::Uniform { scale: 0.1 }, Optimizer::sgd(1.0))
}

/// Full rows by id: `[weights | show, click, delta, unseen | state]`.
fn rows(t: &SparseTable) -> std::collections::BTreeMap<u64, Vec<f32>> {
    let mut all = std::collections::BTreeMap::new();
    t.for_each_row(|id, row| {
        all.insert(id, row.to_vec());
    });
    all
}

fn push(t: &SparseTable, ids: &[u64], show: f32, click: f32) {
    let counts: Vec<f32> = ids.iter().flat_map(|_| [show, click]).collect();
    t.push(ids, &counts, &vec![0.5; ids.len() * 3], 1.0).unwrap();
}

#[test]
fn pushes_gather_each_rows_statistics() {
    let t = SparseTable::new(spec());
    push(&t, &[1, 2], 3.0, 1.0);
    push(&t, &[1], 2.0, 0.0);
    let all = rows(&t);
    // Row 1: show 5, click 1, delta 0.1 * 2 + 1 + 0.1 * 2 = 1.4, unseen 0.
    assert_eq!(&all[&1][3..5], &[5.0, 1.0]);
    assert!((all[&1][5] - 1.4).abs() < 1e-6);
    assert_eq!(all[&1][6], 0.0);
    assert_eq!(&all[&2][3..5], &[3.0, 1.0]);
}

#[test]
fn a_count_filter_admits_on_the_nth_sighting_and_pulls_create_nothing() {
    let t = SparseTable::new(SparseSpec { entry: Entry::Count(3), ..spec() });
    let mut out = vec![0.0; 3];
    t.pull(&[7], &mut out, true).unwrap();
    assert!(t.is_empty(), "a training pull does not create a row under admission");
    let mut init = vec![0.0; 3];
    t.spec().init_row(7, &mut init);
    assert_eq!(out, init, "an id not admitted reads as its initial value");
    push(&t, &[7], 1.0, 0.0);
    push(&t, &[7], 1.0, 0.0);
    assert!(t.is_empty());
    assert_eq!(t.lifecycle().filtered, 2);
    push(&t, &[7], 1.0, 0.0);
    // Admitted on the third sighting: that push's gradient applied (SGD, lr 1, scale 1).
    let row = &rows(&t)[&7];
    assert_eq!(&row[..3], &[init[0] - 0.5, init[1] - 0.5, init[2] - 0.5]);
    assert_eq!(row[3], 1.0, "the statistics start at the admitting push");
    assert_eq!(t.lifecycle().admitted, 1);
    // Two sightings in one batch count twice.
    push(&t, &[8], 2.0, 0.0);
    push(&t, &[8], 1.0, 0.0);
    assert_eq!(t.len(), 2);
}

#[test]
fn pending_sightings_are_forgotten_by_their_own_window_when_one_is_set() {
    // By default a pending id is forgotten by the rows' rule (unseen for more than 30 days):
    // seen once on each of two days, it is admitted.
    let t = SparseTable::new(SparseSpec { entry: Entry::Count(2), ..spec() });
    push(&t, &[7], 1.0, 0.0);
    assert_eq!(t.shrink(1), 0);
    push(&t, &[7], 1.0, 0.0);
    assert_eq!((t.len(), t.lifecycle().forgotten), (1, 0));
    // With `filter_forget_after_days = 0` a day's shrink forgets every pending sighting, so
    // only an id seen twice within one day is admitted; the rows keep their own rule.
    let t = SparseTable::new(SparseSpec { entry: Entry::Count(2), filter_forget_after_days: Some(0.0), ..spec() });
    push(&t, &[7, 8, 8], 1.0, 0.0);
    assert_eq!(t.len(), 1, "8 was seen twice within the day");
    assert_eq!(t.shrink(1), 0, "the row of 8 is one day unseen: kept");
    assert_eq!(t.lifecycle().forgotten, 1, "7 is forgotten");
    push(&t, &[7], 1.0, 0.0);
    assert_eq!(t.len(), 1, "7's sighting today is a first one again");
    push(&t, &[7], 1.0, 0.0);
    assert_eq!(t.len(), 2);
    // A shrink within the day (0 days) forgets nothing.
    push(&t, &[9], 1.0, 0.0);
    t.shrink(0);
    push(&t, &[9], 1.0, 0.0);
    assert_eq!((t.len(), t.lifecycle().forgotten), (3, 1));
    // A window that is no number of days is refused.
    for bad in [-1.0, f32::NAN, f32::INFINITY] {
        let table = SparseSpec { entry: Entry::Count(2), filter_forget_after_days: Some(bad), ..spec() };
        let dense = super::DenseSpec { params: Vec::new(), block_size: 1, seed: 0, optimizer: Optimizer::sgd(1.0) };
        let err = super::TableSpec { dense, sparse: vec![table] }.validate().unwrap_err();
        assert!(err.contains("filter_forget_after_days"), "{err}");
    }
}

#[test]
fn probability_entry_admits_about_p_of_the_ids_seen_once() {
    let t = SparseTable::new(SparseSpec { entry: Entry::Probability(0.25), ..spec() });
    let ids: Vec<u64> = (0..20_000).collect();
    push(&t, &ids, 1.0, 0.0);
    let admitted = t.len();
    assert!((4_500..5_500).contains(&admitted), "{admitted} of 20000 at p = 0.25");
    assert_eq!(t.lifecycle().filtered as usize, ids.len() - admitted);
}

#[test]
fn a_full_table_evicts_the_lowest_score_row_and_never_outgrows_its_capacity() {
    // 64 stripes of 2 rows each.
    let t = SparseTable::new(SparseSpec { capacity: Some(128), ..spec() });
    // Every id shown 10 times except the cold ones (shown once).
    let hot: Vec<u64> = (0..96).collect();
    let cold: Vec<u64> = (1000..1032).collect();
    push(&t, &hot, 10.0, 0.0);
    push(&t, &cold, 1.0, 0.0);
    let life = t.lifecycle();
    assert_eq!(t.len() as u64, life.admitted - life.evicted);
    assert!(t.len() <= 128);
    let first = rows(&t);
    // Newcomers shown 5 times, one at a time: each evicts the lowest-score row of its stripe,
    // so a row shown 10 times goes only from a stripe that holds no row shown once.
    for id in 5000..5300u64 {
        let before = rows(&t);
        push(&t, &[id], 5.0, 0.0);
        assert!(t.len() <= 128, "{} rows over a capacity of 128", t.len());
        let after = rows(&t);
        for gone in before.keys().filter(|k| !after.contains_key(k)) {
            assert_eq!(
                crate::base::layout::stripe_of(*gone),
                crate::base::layout::stripe_of(id),
                "evicted from its own stripe"
            );
            let colder = before.iter().any(|(k, r)| {
                k != gone
                    && crate::base::layout::stripe_of(*k) == crate::base::layout::stripe_of(id)
                    && r[3] < before[gone][3]
            });
            assert!(!colder, "row {gone} (show {}) evicted while a colder row stayed", before[gone][3]);
        }
    }
    assert!(t.lifecycle().evicted >= 300 - 128);
    let after = rows(&t);
    let kept_cold = cold.iter().filter(|id| after.contains_key(id)).count();
    assert!(kept_cold < cold.len() / 4, "{kept_cold} of the cold rows are still held");
    // Re-admitted ids start from their seed again, bit for bit.
    let gone = *first.keys().find(|id| !after.contains_key(id)).expect("some row was evicted");
    let mut out = vec![0.0; 3];
    t.pull(&[gone], &mut out, true).unwrap();
    let mut init = vec![0.0; 3];
    t.spec().init_row(gone, &mut init);
    assert_eq!(out, init);
}

#[test]
fn a_batch_never_evicts_its_own_rows() {
    // One row per stripe: a batch of two new ids in one stripe keeps one and leaves the other.
    let t = SparseTable::new(SparseSpec { capacity: Some(64), ..spec() });
    let same: Vec<u64> = (0..10_000u64).filter(|&i| crate::base::layout::stripe_of(i) == 0).take(2).collect();
    push(&t, &same, 1.0, 0.0);
    assert_eq!(t.len(), 1);
    assert_eq!(t.lifecycle().no_room, 1);
}

#[test]
fn an_id_repeated_in_one_push_gets_one_row_and_every_update() {
    // Oar's trainers never repeat an id in a push; another peer may. Under a capacity an
    // admitted newcomer once got a row per occurrence, filling the table with copies.
    for entry in [Entry::All, Entry::Count(1)] {
        let t = SparseTable::new(SparseSpec { entry, capacity: Some(64 * 4), ..spec() });
        push(&t, &[7, 7, 7, 8], 1.0, 1.0);
        let all = rows(&t);
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![7, 8]);
        assert_eq!(t.lifecycle().admitted, 2);
        // Each occurrence counted and applied (SGD at rate 1, 0.5 a time): 3 shows, 3 clicks.
        for (id, n) in [(7, 3.0), (8, 1.0)] {
            let (row, mut start) = (&all[&id], [0.0; 3]);
            spec().init_row(id, &mut start);
            assert_eq!((row[3], row[4]), (n, n), "id {id}");
            for d in 0..3 {
                assert!((row[d] - (start[d] - 0.5 * n)).abs() < 1e-6, "id {id}: {row:?} from {start:?}");
            }
        }
    }
}

#[test]
fn shrink_decays_and_deletes_as_paddle_does() {
    let a = Accessor {
        show_click_decay_rate: 0.5,
        delete_threshold: 0.3,
        delete_after_unseen_days: 2.0,
        ..Accessor::default()
    };
    let t = SparseTable::new(SparseSpec { accessor: a, ..spec() });
    push(&t, &[1], 10.0, 0.0); // score 1.0 -> 0.5 after one decay: kept, then 0.25: deleted
    push(&t, &[2], 1.0, 1.0); // score 1.0 (a click) -> 0.5, 0.25: deleted at the second
    push(&t, &[3], 100.0, 0.0); // score 10: kept until unseen for more than 2 days
    assert_eq!(t.shrink(1), 0);
    assert_eq!(rows(&t)[&1][3], 5.0);
    assert_eq!(t.shrink(1), 2, "ids 1 and 2 fall below 0.3");
    assert_eq!(t.len(), 1);
    assert_eq!(t.shrink(1), 1, "id 3 unseen for 3 days");
    let life = t.lifecycle();
    assert_eq!((life.shrunk_score, life.shrunk_unseen), (2, 1));
    assert!(t.is_empty());
    // A deleted row's state row is reused: the table takes no more memory for a new id.
    push(&t, &[4], 1.0, 0.0);
    assert_eq!(rows(&t)[&4][3], 1.0);
}

#[test]
fn rows_below_the_embedx_threshold_train_and_read_their_first_weight_only() {
    let a = Accessor { embedx_threshold: 1.0, ..Accessor::default() };
    let t = SparseTable::new(SparseSpec { accessor: a, optimizer: Optimizer::adagrad(0.1), ..spec() });
    let mut init = vec![0.0; 3];
    t.spec().init_row(5, &mut init);
    let mut out = vec![0.0; 3];
    t.pull(&[5], &mut out, true).unwrap();
    assert_eq!(out, [init[0], 0.0, 0.0]);
    push(&t, &[5], 5.0, 0.0); // score 0.5: below
    let row = rows(&t)[&5].clone();
    assert_ne!(row[0], init[0]);
    assert_eq!(&row[1..3], &init[1..3], "embedx untouched");
    push(&t, &[5], 5.0, 0.0); // score 1.0: live
    t.pull(&[5], &mut out, false).unwrap();
    assert!(out[1] != 0.0 && out[1] != init[1], "embedx reads and trains once the row is live");
}

#[test]
fn a_batch_that_grows_an_admitting_table_keeps_every_rows_update() {
    // The stripes grow while the batch is applied: each id must still get its own row.
    let t = SparseTable::new(SparseSpec { entry: Entry::Count(1), capacity: Some(1 << 20), ..spec() });
    let ids: Vec<u64> = (0..20_000).collect();
    push(&t, &ids, 1.0, 1.0);
    push(&t, &ids, 1.0, 0.0);
    let all = rows(&t);
    assert_eq!(all.len(), ids.len());
    assert!(all.values().all(|r| r[3] == 2.0 && r[4] == 1.0));
}

fn as_map(e: &super::TableExport, dim: usize) -> std::collections::BTreeMap<u64, Vec<f32>> {
    e.ids.iter().zip(e.weights.chunks_exact(dim)).map(|(&id, w)| (id, w.to_vec())).collect()
}

#[test]
fn deltas_applied_on_their_base_give_the_base_saved_at_the_same_moment() {
    let a = Accessor { show_click_decay_rate: 0.9, delete_threshold: 0.15, ..Accessor::default() };
    let t = SparseTable::new(SparseSpec { accessor: a, capacity: Some(64 * 30), ..spec() });
    let ids: Vec<u64> = (0..1500).collect();
    push(&t, &ids, 2.0, 0.0);
    let mut served = as_map(&t.export(false), 3);
    assert_eq!(served.len(), t.len());
    for round in 1..=4u64 {
        // Old ids again, new ones (evicting under the capacity), then a day's shrink.
        let again: Vec<u64> = (0..300).map(|i| i * 5 + round).collect();
        push(&t, &again, 1.0, 1.0);
        let new: Vec<u64> = (0..400).map(|i| 10_000 * round + i).collect();
        push(&t, &new, 1.0 + round as f32, 0.0);
        t.shrink(1);
        let delta = t.export(true);
        assert!(delta.ids.len() < t.len(), "a delta holds the rows pushed since the last save only");
        for id in &delta.deleted {
            served.remove(id);
        }
        served.extend(as_map(&delta, 3));
        assert_eq!(served, as_map(&t.export(false), 3), "round {round}");
    }
    let life = t.lifecycle();
    assert!(life.evicted > 0 && life.shrunk_score > 0, "{life:?}");
}
