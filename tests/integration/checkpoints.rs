//! Background checkpoints: written while training goes on, pruned to the last few, loaded by a
//! restarted server; a damaged newest one falls back to the previous; a full disk fails one
//! checkpoint and not the training.

use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig};
use oar::protocol::Mode;
use oar::protocol::RowCreation;
use oar::server::shard_checkpoints::{
    earlier_life, load_latest, server_dir, Checkpointer, Cut, EarlierLife, Entry, Fence, Policy, Trainers,
};
use oar::server::ServerConfig;

/// A server on loopback until the returned sender is dropped.
fn serve(config: ServerConfig) -> (String, std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            let shutdown = async move {
                let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
            };
            oar::server::run(vec![listener], config, shutdown).await.unwrap();
        })
    });
    (addr_rx.recv().unwrap(), stop, handle)
}

/// Trainer 0's client (only a trainer may declare).
fn trainer0(addr: &str) -> Client {
    let config = ClientConfig::new(vec![addr.to_string()], "test", Duration::from_secs(5), Duration::from_secs(30));
    Client::connect(&config.as_trainer(0)).unwrap()
}

fn entries(dir: &std::path::Path) -> Vec<Entry> {
    let mut all: Vec<Entry> = std::fs::read_dir(server_dir(dir, 0))
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".tmp"))
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path().join("entry.json")).ok()?).ok())
        .collect();
    all.sort_by_key(|e| e.seq);
    all
}

/// Two async trainers train against a server checkpointing every 10 ms: checkpoints appear
/// without stopping training, only the last two are kept, one soon holds the final state, and a
/// new server resumed from the folder serves exactly that state.
#[test]
fn background_checkpoints_follow_training_and_a_restarted_server_loads_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 2000, 10);
    let ckpt = dir.path().join("checkpoints");
    let policy = Policy { dir: ckpt.clone(), every: Duration::from_millis(10), keep: 2 };
    let config =
        ServerConfig { exit_when_done: false, checkpoints: Some(policy), ..server_config(0, 1, 2, Mode::Async) };
    let (addr, stop, handle) = serve(config.clone());
    let configs = (0..2)
        .map(|t| {
            let mut c = train_config(Mode::Async, &[], t, 2, &train);
            c.servers = vec![addr.clone()];
            c
        })
        .collect();
    let reports = run_trainers(configs);
    assert!(reports.iter().all(|r| r.samples == 2000));
    let mut c = trainer0(&addr);
    let tc = train_config(Mode::Async, &[], 0, 2, &train);
    c.declare(&criteo_model(&tc.model).table_spec(tc.dense_optimizer, tc.sparse_optimizer)).unwrap();
    let version = c.stats().unwrap()[0].version;
    let mut live = Vec::new();
    c.pull(Some(&mut live), &[], &mut [], RowCreation::Peek).unwrap();
    wait_until(60, "a checkpoint of the final state, after at least three", || {
        let e = entries(&ckpt);
        e.last().is_some_and(|last| last.version == version && last.seq >= 3)
    });
    drop(stop);
    handle.join().unwrap();
    let kept = entries(&ckpt);
    assert!(kept.len() <= 2, "kept {kept:?}");

    let (entry, shard) = load_latest(&ckpt, 0, "test").unwrap();
    assert_eq!(entry.version, version);
    assert!(!shard.sparse[0].is_empty(), "the rows were checkpointed");
    let resumed = ServerConfig { resume: Some(ckpt.clone()), checkpoints: None, ..config };
    let (addr, stop, handle) = serve(resumed);
    let (mut dense, mut c) = (Vec::new(), trainer0(&addr));
    c.declare(&shard.spec).unwrap();
    c.pull(Some(&mut dense), &[], &mut [], RowCreation::Peek).unwrap();
    assert_eq!(dense, live, "the restarted server serves the checkpointed state");
    drop(stop);
    handle.join().unwrap();
}

fn fence() -> Fence {
    Fence { job: "test".into(), epoch: 0 }
}

pub fn small_shard() -> oar::table::Shard {
    let spec = criteo_model(&oar::model::ModelConfig { hidden: Some(vec![4]), ..Default::default() })
        .table_spec(oar::table::Optimizer::adam(1e-3), oar::table::Optimizer::adagrad(0.1));
    let shard = oar::table::Shard::new(spec, 0, 1);
    let mut rows = vec![0.0; 30];
    shard.sparse[0].pull(&[1, 2, 3], &mut rows, true).unwrap();
    shard
}

/// What a restarted (`--recoverable`) server reads of its earlier life: nothing in a fresh
/// folder or one claimed by another job; else the last epoch, whether the newest checkpoint is
/// this job's (an earlier job's never is) and where the trainers were.
#[test]
fn a_restarted_server_finds_only_its_own_jobs_earlier_life() {
    let dir = tempfile::tempdir().unwrap();
    let policy = || Policy { dir: dir.path().to_path_buf(), every: Duration::from_secs(1), keep: 3 };
    assert_eq!(earlier_life(dir.path(), 0, "test").unwrap(), None);
    // An earlier job checkpointed here; this job's first process claims the folder, then dies.
    Checkpointer::new(policy(), 0, Fence { job: "old".into(), epoch: 4 })
        .unwrap()
        .write(Cut::of(&small_shard(), 9))
        .unwrap();
    assert_eq!(earlier_life(dir.path(), 0, "test").unwrap(), None, "another job's folder");
    Checkpointer::new(policy(), 0, fence()).unwrap();
    let life = earlier_life(dir.path(), 0, "test").unwrap().unwrap();
    assert_eq!(
        life,
        EarlierLife { epoch: 0, checkpoint: false, finished: false, unreadable: vec![] },
        "the old job's checkpoint is not ours"
    );
    assert_eq!(Trainers::read(dir.path(), 0, "test", 2).unwrap(), None);
    // Its restart (epoch 1) checkpoints and sees trainer 1 close and trainer 0 end pass 2.
    let mut c = Checkpointer::new(policy(), 0, Fence { job: "test".into(), epoch: 1 }).unwrap();
    c.write(Cut::of(&small_shard(), 12)).unwrap();
    let trainers = Trainers { job: "test".into(), closed: vec![1], pass: 2, ended: vec![0] };
    trainers.write(dir.path(), 0).unwrap();
    let life = earlier_life(dir.path(), 0, "test").unwrap().unwrap();
    assert_eq!(life, EarlierLife { epoch: 1, checkpoint: true, finished: false, unreadable: vec![] });
    assert_eq!(Trainers::read(dir.path(), 0, "test", 2).unwrap(), Some(trainers));
    assert_eq!(load_latest(dir.path(), 0, "test").unwrap().0.job, "test");
    // Another job starting here afresh sees none of it.
    assert_eq!(earlier_life(dir.path(), 0, "new").unwrap(), None);
    assert_eq!(Trainers::read(dir.path(), 0, "new", 2).unwrap(), None);
}

/// The newest checkpoint damaged (one byte flipped): loading takes the previous one.
#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous() {
    let dir = tempfile::tempdir().unwrap();
    let shard = small_shard();
    let mut c =
        Checkpointer::new(Policy { dir: dir.path().to_path_buf(), every: Duration::from_secs(1), keep: 3 }, 0, fence())
            .unwrap();
    c.write(Cut::of(&shard, 1)).unwrap();
    c.write(Cut::of(&shard, 2)).unwrap();
    let newest = server_dir(dir.path(), 0).join("ckpt-000002").join("server-0.shard");
    let mut bytes = std::fs::read(&newest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&newest, bytes).unwrap();
    let (entry, loaded) = load_latest(dir.path(), 0, "test").unwrap();
    assert_eq!((entry.seq, entry.version), (1, 1));
    assert_eq!(loaded.sparse[0].len(), 3);
}

/// A small tmpfs mounted for a test and unmounted when dropped (a panic included); `None` where
/// this process may not mount (not root, or no mount privilege).
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, kib: u64) -> Option<SmallDisk> {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status();
        status.is_ok_and(|s| s.success()).then(|| SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A checkpoint on a full disk (a small tmpfs filled up) fails with that error and leaves
/// nothing behind; once there is room again the next one succeeds.
#[test]
fn a_checkpoint_on_a_full_disk_fails_alone_and_the_next_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_disk) = SmallDisk::mount(dir.path(), 512) else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root); the full-disk path is not tested");
        return;
    };
    let shard = small_shard();
    let mut c =
        Checkpointer::new(Policy { dir: dir.path().to_path_buf(), every: Duration::from_secs(1), keep: 3 }, 0, fence())
            .unwrap();
    let filler = dir.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    let err = c.write(Cut::of(&shard, 1)).unwrap_err().to_string();
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!server_dir(dir.path(), 0).join("ckpt-000001.tmp").exists(), "the failed checkpoint's folder is removed");
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(c.write(Cut::of(&shard, 2)).unwrap().seq, 2);
    assert_eq!(load_latest(dir.path(), 0, "test").unwrap().0.seq, 2);
}

/// A link planted where a checkpoint writes its temporary file is removed, not followed: the
/// file it points to is untouched and the checkpoint is written in its folder.
#[test]
fn a_link_planted_at_a_checkpoints_temporary_file_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("precious");
    std::fs::write(&target, b"keep me").unwrap();
    let shard = small_shard();
    let mut c =
        Checkpointer::new(Policy { dir: dir.path().to_path_buf(), every: Duration::from_secs(1), keep: 3 }, 0, fence())
            .unwrap();
    // Planted after the checkpointer starts (it clears temporary folders a crash left).
    let tmp = server_dir(dir.path(), 0).join("ckpt-000001.tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::os::unix::fs::symlink(&target, tmp.join("server-0.shard.tmp")).unwrap();
    assert_eq!(c.write(Cut::of(&shard, 1)).unwrap().seq, 1);
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert_eq!(load_latest(dir.path(), 0, "test").unwrap().0.seq, 1);
}
