//! Shard files: round trips, corruption, the admission state.

use super::*;
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, SparseSpec};

fn spec() -> TableSpec {
    TableSpec {
        dense: DenseSpec {
            params: vec![DenseParam::new("w", 50, Init::Uniform { scale: 0.1 })],
            block_size: 8,
            seed: 3,
            optimizer: Optimizer::adam(0.01),
        },
        sparse: vec![SparseSpec::new("emb", 4, 5, Init::Uniform { scale: 0.1 }, Optimizer::adagrad(0.1))],
    }
}

#[test]
fn a_shard_survives_save_and_load_and_corruption_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let shard = Shard::new(spec(), 1, 2);
    let ids = [3u64, 99, 1 << 50];
    let mut rows = vec![0.0; 12];
    shard.sparse[0].pull(&ids, &mut rows, true).unwrap();
    shard.sparse[0].push(&ids, &[1.0; 6], &[0.5; 12], 1.0).unwrap();
    let n = shard.dense.lock().len();
    shard.dense.lock().apply(&vec![1.0; n], 1.0, 1.0).unwrap();

    let (name, bytes, crc) = write_shard(&shard, dir.path()).unwrap();
    let path = dir.path().join(&name);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes);
    assert_eq!(crc32fast::hash(&std::fs::read(&path).unwrap()[..bytes as usize - 4]), crc);

    let back = read_shard(&path).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    shard.dense.lock().read(&mut a);
    back.dense.lock().read(&mut b);
    assert_eq!(a, b);
    let mut again = vec![0.0; 12];
    back.sparse[0].pull(&ids, &mut again, false).unwrap();
    shard.sparse[0].pull(&ids, &mut rows, false).unwrap();
    assert_eq!(rows, again);

    let mut damaged = std::fs::read(&path).unwrap();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x40;
    std::fs::write(&path, &damaged).unwrap();
    let err = read_shard(&path).err().expect("corruption must be detected").to_string();
    assert!(err.contains("server-1.shard") && err.contains("CRC-32 mismatch"), "{err}");
}

#[test]
fn a_restarted_server_remembers_the_sightings_of_ids_not_admitted_yet() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec();
    spec.sparse[0].entry = crate::table::Entry::Count(2);
    spec.sparse[0].filter_capacity = 4096;
    spec.sparse.push(SparseSpec {
        entry: crate::table::Entry::Probability(0.5),
        ..SparseSpec::new("p", 2, 6, Init::Zeros, Optimizer::adagrad(0.1))
    });
    let shard = Shard::new(spec, 0, 1);
    let ids: Vec<u64> = (1..=200).collect();
    let push = |s: &Shard, t: usize, dim: usize| {
        s.sparse[t].push(&ids, &vec![1.0; 2 * ids.len()], &vec![0.1; dim * ids.len()], 1.0).unwrap();
    };
    // One sighting each: no row under count_filter_entry:2.
    push(&shard, 0, 4);
    push(&shard, 1, 2);
    assert_eq!(shard.sparse[0].len(), 0);
    let draws = shard.sparse[1].admission();
    let back = read_shard(&dir.path().join(write_shard(&shard, dir.path()).unwrap().0)).unwrap();
    assert_eq!(back.sparse[1].admission(), draws, "the probability entry's draws carry on");
    // The second sighting after the restart admits every id (a 4,096-cell filter holds 200).
    push(&back, 0, 4);
    assert_eq!(back.sparse[0].len(), 200);
    // A server that forgot (format 2) would have given none.
    let fresh = Shard::new(back.spec.clone(), 0, 1);
    push(&fresh, 0, 4);
    assert_eq!(fresh.sparse[0].len(), 0);
}

#[test]
fn a_missing_model_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Manifest::find(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a saved model"), "{err}");
}

#[test]
fn pending_sightings_keep_their_days_and_a_format_3_shard_reads_them_as_seen_today() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec();
    spec.sparse[0].entry = crate::table::Entry::Count(2);
    spec.sparse[0].filter_capacity = 4096;
    let shard = Shard::new(spec, 0, 1);
    let ids: Vec<u64> = (1..=50).collect();
    shard.sparse[0].push(&ids, &vec![1.0; 100], &vec![0.1; 200], 1.0).unwrap();
    shard.sparse[0].shrink(2);
    let state = shard.sparse[0].admission();
    assert_eq!(state.iter().flat_map(|s| &s.days).filter(|&&d| d == 2).count(), 50, "50 ids, 2 days unseen");
    let (name, _, _) = write_shard(&shard, dir.path()).unwrap();
    let path = dir.path().join(&name);
    assert_eq!(read_shard(&path).unwrap().sparse[0].admission(), state, "format 4 keeps the days");

    // The same file as format 3 wrote it: the header says 3 and no days follow the cells.
    let bytes = std::fs::read(&path).unwrap();
    let json_len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[16..16 + json_len]).unwrap();
    header["format"] = 3.into();
    let cells = shard.sparse[0].spec().filter_cells_per_stripe();
    let admission_at = bytes.len() - 4 - crate::base::layout::STRIPES * (8 + 3 * cells);
    let mut old = bytes[..8].to_vec();
    let json = serde_json::to_vec(&header).unwrap();
    old.extend_from_slice(&(json.len() as u64).to_le_bytes());
    old.extend_from_slice(&json);
    old.extend_from_slice(&bytes[16 + json_len..admission_at]);
    for stripe in bytes[admission_at..bytes.len() - 4].chunks_exact(8 + 3 * cells) {
        old.extend_from_slice(&stripe[..8 + 2 * cells]);
    }
    old.extend_from_slice(&crc32fast::hash(&old).to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    let back = read_shard(&path).unwrap();
    let restored = back.sparse[0].admission();
    assert_eq!(
        restored.iter().map(|s| &s.cells).collect::<Vec<_>>(),
        state.iter().map(|s| &s.cells).collect::<Vec<_>>()
    );
    assert!(restored.iter().flat_map(|s| &s.days).all(|&d| d == 0), "format 3 kept no days");
    // Either way the second sighting admits them all.
    back.sparse[0].push(&ids, &vec![1.0; 100], &vec![0.1; 200], 1.0).unwrap();
    assert_eq!(back.sparse[0].len(), 50);
}

/// A final save takes only this job's and this pass's entries: an entry an earlier run left in
/// the folder once went into the new manifest, naming a shard of another save.
#[test]
fn a_final_save_ignores_an_entry_left_by_an_earlier_run() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("pass-0001");
    std::fs::create_dir(&dir).unwrap();
    let model = serde_json::Value::Null;
    let (zero, one) = (Shard::new(spec(), 0, 2), Shard::new(spec(), 1, 2));
    // An earlier job saved server 1's shard here.
    assert!(!save_server_final(&one, &dir, "old", 1, &model).unwrap());
    // This job's server 0: server 1's entry is the old job's, so no manifest yet.
    assert!(!save_server_final(&zero, &dir, "new", 1, &model).unwrap());
    assert!(!dir.join("manifest.json").exists());
    // This job's server 1 completes it, with both of this job's entries.
    assert!(save_server_final(&one, &dir, "new", 1, &model).unwrap());
    let (manifest, _) = Manifest::find(&dir).unwrap();
    assert_eq!((manifest.job.as_str(), manifest.pass, manifest.shards.len()), ("new", 1, 2));
    load_merged(&dir).unwrap();
}

/// A model saved by 2 servers and loaded by 1 (`load_resharded`): rows and blocks come from both
/// files; a table's capacity per server that the one server would pass, and a count filter
/// (its pending ids are each server's), are refused by name.
#[test]
fn a_save_goes_on_resharded_unless_a_capacity_or_a_count_filter_forbids_it() {
    let save = |spec: TableSpec, dir: &Path| {
        let mut shards = Vec::new();
        for index in 0..2 {
            let shard = Shard::new(spec.clone(), index, 2);
            let ids: Vec<u64> = (1..=400).filter(|&id| crate::base::layout::server_of_row(0, id, 2) == index).collect();
            // Pushed, twice: a capped or filtered table creates rows only from pushes.
            for _ in 0..2 {
                shard.sparse[0].push(&ids, &vec![1.0; 2 * ids.len()], &vec![0.1; 4 * ids.len()], 1.0).unwrap();
            }
            let (file, bytes, crc32) = write_shard(&shard, dir).unwrap();
            shards.push(ShardEntry { file, bytes, crc32 });
        }
        let manifest = Manifest {
            format: FORMAT_VERSION,
            job: "j".into(),
            pass: 1,
            num_servers: 2,
            spec,
            model: serde_json::Value::Null,
            shards,
        };
        manifest.write(dir).unwrap();
        manifest
    };
    let dir = tempfile::tempdir().unwrap();
    let m = save(spec(), dir.path());
    let one = m.load_resharded(dir.path(), 0, 1).unwrap();
    assert_eq!(one.sparse[0].len(), 400);
    let three: usize = (0..3).map(|i| m.load_resharded(dir.path(), i, 3).unwrap().sparse[0].len()).sum();
    assert_eq!(three, 400);

    let capped = tempfile::tempdir().unwrap();
    let mut spec_capped = spec();
    spec_capped.sparse[0].capacity = Some(300);
    let m = save(spec_capped, capped.path());
    let err = m.load_to_continue(capped.path(), 0, 1).err().unwrap().to_string();
    assert!(err.contains("rows on server 0 of 1, over its capacity of 300 per server"), "{err}");
    assert!(m.load_to_continue(capped.path(), 0, 2).is_ok());
    // Read whole (evaluation, export), the rows merge whatever the bounds.
    assert!(m.load_resharded(capped.path(), 0, 1).is_ok());

    let counted = tempfile::tempdir().unwrap();
    let mut spec_counted = spec();
    spec_counted.sparse[0].entry = crate::table::Entry::Count(1);
    spec_counted.sparse[0].filter_capacity = 4096;
    let m = save(spec_counted, counted.path());
    let err = m.load_to_continue(counted.path(), 0, 3).err().unwrap().to_string();
    assert!(err.contains("count filter (count_filter_entry) keeps each server's pending ids"), "{err}");
}

/// A value that is not a finite number, or an id listed twice, makes a shard unreadable, named:
/// a NaN scored every sample NaN (or hid behind a ReLU as constant scores), and a repeated id
/// left fewer rows than the file listed, without a word.
#[test]
fn a_shard_with_a_non_finite_value_or_a_repeated_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [3u64, 99, 1 << 50];
    let saved = || {
        let shard = Shard::new(spec(), 0, 1);
        shard.sparse[0].pull(&ids, &mut [0.0; 12], true).unwrap();
        shard
    };
    let refused = |shard: &Shard| {
        let (name, _, _) = write_shard(shard, dir.path()).unwrap();
        read_shard(&dir.path().join(name)).err().expect("refused").to_string()
    };
    let nan_weight = saved();
    std::sync::Arc::make_mut(&mut nan_weight.dense.lock().blocks[2].weights)[1] = f32::NAN;
    let e = refused(&nan_weight);
    assert!(e.contains("server-0.shard") && e.contains("a dense weight that is not a finite number"), "{e}");
    let inf_state = saved();
    inf_state.dense.lock().blocks[0].state[0] = f32::INFINITY;
    assert!(refused(&inf_state).contains("a dense optimizer state that is not a finite number"));
    let nan_row = saved();
    let mut row = vec![0.5; nan_row.sparse[0].row_len()];
    row[1] = f32::NAN;
    nan_row.sparse[0].insert_row(99, &row).unwrap();
    assert!(refused(&nan_row).contains("a sparse row that is not a finite number"));

    // The second id made the first's, with the file's CRC made whole again.
    let good = saved();
    let (name, _, _) = write_shard(&good, dir.path()).unwrap();
    let path = dir.path().join(name);
    let mut bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let dense: usize = good.dense.lock().blocks.iter().map(|b| b.weights.len() + b.state.len()).sum();
    let first = 16 + header + dense * 4;
    let stored: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[first..first + 24]);
    assert_eq!(stored.iter().copied().collect::<std::collections::BTreeSet<_>>(), ids.into(), "ids found");
    bytes.copy_within(first..first + 8, first + 8);
    let end = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..end]).to_le_bytes();
    bytes[end..].copy_from_slice(&crc);
    std::fs::write(&path, &bytes).unwrap();
    let e = read_shard(&path).err().expect("refused").to_string();
    assert!(e.contains("lists 3 rows but 2 distinct ids"), "{e}");
}
