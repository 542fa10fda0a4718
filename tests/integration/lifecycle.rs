//! Tables that live for months, end to end on 2 servers x 2 trainers: row statistics counted at
//! the servers against the data's own counts, admission by count (and pending sightings
//! forgotten by a shrink), a capacity that is never exceeded, and `oar shrink` (a real process)
//! against live servers.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use oar::client::{Client, ClientConfig};
use oar::protocol::{Mode, ServerStats};
use oar::server::ServerConfig;

use crate::util::*;

/// Shows and clicks per id over every training line, as the data says.
fn counts_in(train: &Path) -> HashMap<u64, (f32, f32)> {
    let schema = oar::data::schema::Schema::criteo();
    let mut parser = oar::data::parser(&schema);
    let mut batch = oar::base::batch::Batch::new(1, 13, 26);
    for file in oar::data::resolve_files(train).unwrap() {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            parser.parse(line.as_bytes(), &mut batch).unwrap();
        }
    }
    let mut counts: HashMap<u64, (f32, f32)> = HashMap::new();
    for k in 0..batch.len() * batch.slots {
        let click = batch.labels[k / batch.slots];
        for i in batch.bag(k) {
            let c = counts.entry(batch.ids[i]).or_default();
            c.0 += 1.0;
            c.1 += click;
        }
    }
    counts
}

/// A dim-4 logistic regression over the 26 slots whose table has `table_extra` settings.
fn job(dir: &Path, table_extra: &str) -> std::path::PathBuf {
    let path = dir.join(format!("job-{}.toml", table_extra.len()));
    let text = format!(
        r#"
[model]
output = "logit"
loss = "log_loss"
tables = [{{ name = "w", dim = 4 {table_extra} }}]
layers = [
  {{ name = "wide", type = "embedding", table = "w", slots = "C1..C26" }},
  {{ name = "s", type = "reduce_sum", input = "wide", over = "all" }},
  {{ name = "d", type = "linear", input = "dense", out = 1 }},
  {{ name = "logit", type = "add", inputs = ["s", "d"] }},
]
[sparse_optimizer]
kind = "adagrad"
lr = 0.05
[train]
batch_size = 256
"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Two servers that stay up after the trainers close (so a tool can still reach them), and
/// two sync trainers run on `train` with `job`'s model, saving into `out`.
fn train_on_live_servers(job: &Path, train: &Path, out: &Path) -> Vec<TestServer> {
    let servers: Vec<TestServer> = (0..2)
        .map(|i| start_server(ServerConfig { exit_when_done: false, ..server_config(i, 2, 2, Mode::Sync) }))
        .collect();
    let configs = (0..2)
        .map(|t| {
            let mut c = job_config(job, Mode::Sync, &servers, t, 2, train);
            c.output = Some(out.to_path_buf());
            c
        })
        .collect();
    run_trainers(configs);
    servers
}

fn stats(servers: &[TestServer]) -> Vec<ServerStats> {
    let addrs = servers.iter().map(|s| s.addr.clone()).collect();
    let config = ClientConfig::new(addrs, "test", Duration::from_secs(10), Duration::from_secs(60));
    Client::connect(&config).unwrap().stats().unwrap()
}

fn rows(stats: &[ServerStats]) -> usize {
    stats.iter().map(|s| s.rows[0]).sum()
}

/// `oar shrink` against the servers: what it printed as its result.
fn shrink(servers: &[TestServer], days: u32) -> Vec<oar::protocol::Shrunk> {
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let out = oar(&["shrink", "--servers", &addrs.join(","), "--job", "test", "--days", &days.to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    let line = text(&out).lines().find_map(|l| l.strip_prefix("OAR_RESULT ").map(str::to_string)).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn servers_count_every_rows_shows_and_clicks_and_oar_shrink_deletes_exactly_the_rows_its_rules_name() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 3_000, 10);
    let data = counts_in(&train);
    let out = dir.path().join("out");
    let servers = train_on_live_servers(&job(dir.path(), ", accessor = { delete_threshold = 0.35 }"), &train, &out);

    // Every id got a row, with the data's own show and click counts (saved by the servers).
    let held = stats(&servers);
    assert_eq!(rows(&held), data.len());
    let (_, shard) = oar::persist::checkpoint::load_merged(&out).unwrap();
    let mut seen = 0;
    shard.sparse[0].for_each_row(|id, row| {
        let stats = oar::table::RowStats::of(&row[4..]);
        assert_eq!((stats.show, stats.click), data[&id], "id {id}");
        assert_eq!(stats.unseen_days, 0.0);
        seen += 1;
    });
    assert_eq!(seen, data.len());

    // A shrink after a day deletes the rows whose score 0.1 * (show - click) + click is below
    // 0.35 (no decay by default), and nothing else.
    let score = |(show, click): (f32, f32)| 0.1 * (show - click) + 1.0 * click;
    let low = data.values().filter(|&&c| score(c) < 0.35).count();
    assert!(low > 0 && low < data.len(), "{low} of {} rows below the threshold", data.len());
    let shrunk = shrink(&servers, 1);
    assert_eq!(shrunk.iter().map(|s| s.deleted[0]).sum::<u64>() as usize, low);
    assert_eq!(shrunk.iter().map(|s| s.rows[0]).sum::<u64>() as usize, data.len() - low);
    let after = stats(&servers);
    assert_eq!(rows(&after), data.len() - low);
    assert_eq!(after.iter().map(|s| s.lifecycle[0].shrunk_score).sum::<u64>() as usize, low);

    // 30 more days unseen (31 in all, more than Paddle's default 30): every row goes.
    let shrunk = shrink(&servers, 30);
    assert_eq!(shrunk.iter().map(|s| s.deleted[0]).sum::<u64>() as usize, data.len() - low);
    let after = stats(&servers);
    assert_eq!(rows(&after), 0);
    assert_eq!(after.iter().map(|s| s.lifecycle[0].shrunk_unseen).sum::<u64>() as usize, data.len() - low);
}

#[test]
fn count_admission_gives_rows_only_to_ids_seen_twice_and_a_capacity_is_never_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 3_000, 10);
    let data = counts_in(&train);
    let twice = data.values().filter(|c| c.0 >= 2.0).count();
    assert!(twice < data.len() * 9 / 10, "the data has ids seen once: {twice} of {}", data.len());

    let admitted = train_on_live_servers(
        &job(dir.path(), r#", entry = "count_filter_entry:2""#),
        &train,
        &dir.path().join("admitted"),
    );
    let held = stats(&admitted);
    // The filter's cells are far more than the ids: no count is lost or shared.
    assert_eq!(rows(&held), twice);
    let filtered: u64 = held.iter().map(|s| s.lifecycle[0].filtered).sum();
    assert!(filtered as usize >= data.len() - twice, "every id seen once was filtered");
    assert!(held.iter().all(|s| s.filter_bytes[0] == 3 * oar::table::DEFAULT_FILTER_CAPACITY));
    // The ids seen once wait in the filter and age as rows do: 30 days unseen are not more than
    // Paddle's default delete_after_unseen_days (30), a 31st forgets every one of them.
    let forgotten = |s: &[ServerStats]| s.iter().map(|s| s.lifecycle[0].forgotten).sum::<u64>() as usize;
    shrink(&admitted, 30);
    assert_eq!(forgotten(&stats(&admitted)), 0);
    shrink(&admitted, 1);
    assert_eq!(forgotten(&stats(&admitted)), data.len() - twice, "every pending id forgotten once");

    let capacity = 300;
    let capped = train_on_live_servers(
        &job(dir.path(), &format!(", capacity = {capacity}")),
        &train,
        &dir.path().join("capped"),
    );
    for s in stats(&capped) {
        let life = s.lifecycle[0];
        assert!(s.rows[0] <= capacity, "server holds {} rows over a capacity of {capacity}", s.rows[0]);
        assert!(life.evicted > 0);
        assert_eq!(s.rows[0] as u64, life.admitted - life.evicted);
    }
}

/// Rows by (table, id) of a save for serving: every server's file of the save in `dir`, with
/// a delta's removals applied first.
fn apply_save(
    served: &mut std::collections::BTreeMap<u64, Vec<f32>>,
    dir: &Path,
    servers: usize,
) -> oar::protocol::ExportKind {
    let mut kind = None;
    for i in 0..servers {
        let (k, tables) = oar::persist::export::read(&dir.join(oar::persist::export::file_name(i))).unwrap();
        let (dim, t) = &tables["w"];
        for id in &t.deleted {
            served.remove(id);
        }
        for (id, w) in t.ids.iter().zip(t.weights.chunks_exact(*dim)) {
            served.insert(*id, w.to_vec());
        }
        kind = Some(k);
    }
    kind.unwrap()
}

#[test]
fn a_base_and_its_deltas_rebuild_the_table_the_servers_saved_and_the_done_file_names_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 2_000, 10);
    let out = dir.path().join("out");
    // A capacity, so rows are evicted between saves and the deltas must name them.
    let job = job(dir.path(), ", capacity = 400");
    let servers: Vec<TestServer> = (0..2).map(|i| start_server(server_config(i, 2, 2, Mode::Sync))).collect();
    let configs = (0..2)
        .map(|t| {
            let mut c = job_config(&job, Mode::Sync, &servers, t, 2, &train);
            (c.output, c.passes, c.delta_every) = (Some(out.clone()), 4, Some(1));
            c
        })
        .collect();
    run_trainers(configs);
    let stats: Vec<ServerStats> = servers.into_iter().map(|s| s.handle.join().unwrap()).collect();
    assert!(stats.iter().all(|s| s.lifecycle[0].evicted > 0));

    let done = oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap();
    let announced: Vec<(u32, &str)> = done.iter().map(|l| (l.pass, l.kind.name())).collect();
    assert_eq!(announced, [(1, "base"), (2, "delta"), (3, "delta"), (4, "delta")]);
    let mut served = std::collections::BTreeMap::new();
    let mut deleted = 0;
    for line in &done {
        let before = served.len();
        assert_eq!(apply_save(&mut served, &line.path, 2), line.kind);
        let manifest: oar::persist::export::ExportManifest =
            serde_json::from_slice(&std::fs::read(line.path.join("export.json")).unwrap()).unwrap();
        assert_eq!((manifest.pass, manifest.kind, manifest.files.len()), (line.pass, line.kind, 2));
        deleted += manifest.files.iter().map(|f| f.deleted[0]).sum::<u64>();
        assert!(line.kind == oar::protocol::ExportKind::Base || before > 0);
    }
    assert!(deleted > 0, "the deltas named evicted rows");
    // The servers' own last checkpoint, saved right after the last delta: the same rows, bit
    // for bit.
    let (_, shard) = oar::persist::checkpoint::load_merged(&out).unwrap();
    let mut saved = std::collections::BTreeMap::new();
    shard.sparse[0].for_each_row(|id, row| {
        saved.insert(id, row[..4].to_vec());
    });
    assert_eq!(served.len(), saved.len());
    assert!(served == saved, "base + deltas differ from the table the servers hold");
}
