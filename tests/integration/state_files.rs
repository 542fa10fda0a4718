//! Every file a restart reads, made hostile: torn, truncated, oversized, another job's, a
//! symbolic link, a named pipe, extreme numbers. Each must give a clear error naming the file
//! or a clean fallback: no panic, no hang, nothing written outside its folder. The readers are
//! driven directly (a watchdog fails a read that hangs), then the processes that read them at
//! start (`oar pserver --recoverable`, `oar train --recoverable`) are run on the worst cases.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::checkpoints::small_shard;
use crate::util::*;
use oar::server::shard_checkpoints::{
    earlier_life, load_latest, server_dir, Checkpointer, Cut, Fence, Policy, Trainers,
};
use oar::train::position::{Position, PositionLog};

/// Runs `f` on another thread; fails if it takes longer than 20 s (a read waiting on a pipe).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("{what} hung"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// The hostile forms of one file; `valid` is its good content, `foreign` another job's.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Torn,
    Empty,
    Oversized,
    Link,
    Pipe,
}

const DAMAGES: [Damage; 5] = [Damage::Torn, Damage::Empty, Damage::Oversized, Damage::Link, Damage::Pipe];

/// Damages the file at `path`; returns the file a link points to (which must stay as it is).
fn damage(path: &Path, how: Damage, limit: u64) -> PathBuf {
    let outside = path.parent().unwrap().parent().unwrap().join("outside.txt");
    std::fs::write(&outside, b"not yours").unwrap();
    let valid = std::fs::read(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    match how {
        // Cut inside the first line (a position record is padded: its half would still hold it).
        Damage::Torn => std::fs::write(path, &valid[..valid.len().min(100) / 2]).unwrap(),
        Damage::Empty => std::fs::write(path, b"").unwrap(),
        // Sparse: as large as claimed, without the disk space.
        Damage::Oversized => std::fs::File::create(path).unwrap().set_len(limit + 1).unwrap(),
        Damage::Link => std::os::unix::fs::symlink(&outside, path).unwrap(),
        Damage::Pipe => mkfifo(path),
    }
    outside
}

fn policy(dir: &Path) -> Policy {
    Policy { dir: dir.to_path_buf(), every: Duration::from_secs(1), keep: 3 }
}

/// A server folder as a job "j" left it: two checkpoints, its claim and its trainers' record.
fn server_folder(dir: &Path) {
    let mut c = Checkpointer::new(policy(dir), 0, Fence { job: "j".into(), epoch: 1 }).unwrap();
    c.write(Cut::of(&small_shard(), 5)).unwrap();
    c.write(Cut::of(&small_shard(), 9)).unwrap();
    Trainers { job: "j".into(), closed: vec![1], pass: 1, ended: vec![] }.write(dir, 0).unwrap();
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn assert_names(err: &str, file: &str) {
    assert!(err.contains(file), "the error names {file}: {err}");
}

#[test]
fn a_damaged_fence_is_an_error_naming_it_never_a_fresh_start() {
    for how in DAMAGES {
        let dir = tempfile::tempdir().unwrap();
        server_folder(dir.path());
        let fence = server_dir(dir.path(), 0).join("fence.json");
        let outside = damage(&fence, how, 1 << 20);
        let d = dir.path().to_path_buf();
        let err = within("reading a fence", move || earlier_life(&d, 0, "j")).unwrap_err().to_string();
        assert_names(&err, "fence.json");
        // Claiming the folder again (a restarted server) refuses too, and writes nothing through a link.
        let d = dir.path().to_path_buf();
        let claim =
            within("claiming", move || Checkpointer::new(policy(&d), 0, Fence { job: "j".into(), epoch: 2 }).err());
        assert!(claim.is_some(), "{how:?}: a damaged claim is not overwritten blindly");
        assert_eq!(std::fs::read(&outside).unwrap(), b"not yours", "{how:?}");
    }
    // Extreme numbers: an epoch that would wrap.
    let dir = tempfile::tempdir().unwrap();
    server_folder(dir.path());
    let fence = server_dir(dir.path(), 0).join("fence.json");
    std::fs::write(&fence, format!(r#"{{"job":"j","epoch":{}}}"#, u64::MAX)).unwrap();
    let err = earlier_life(dir.path(), 0, "j").unwrap_err().to_string();
    assert!(err.contains("epoch 18446744073709551615 is beyond"), "{err}");
    // Another job's claim: a fresh start for this one.
    std::fs::write(&fence, r#"{"job":"other","epoch":3}"#).unwrap();
    assert_eq!(earlier_life(dir.path(), 0, "j").unwrap(), None);
}

#[test]
fn a_damaged_trainers_record_is_an_error_naming_it() {
    for how in DAMAGES {
        let dir = tempfile::tempdir().unwrap();
        server_folder(dir.path());
        let record = server_dir(dir.path(), 0).join("trainers.json");
        let outside = damage(&record, how, 1 << 20);
        let d = dir.path().to_path_buf();
        let err = within("reading trainers.json", move || Trainers::read(&d, 0, "j", 2)).unwrap_err().to_string();
        assert_names(&err, "trainers.json");
        // A new record replaces whatever is there, never writing through it.
        let d = dir.path().to_path_buf();
        within("writing trainers.json", move || {
            Trainers { job: "j".into(), closed: vec![], pass: 2, ended: vec![0] }.write(&d, 0).unwrap()
        });
        assert_eq!(std::fs::read(&outside).unwrap(), b"not yours", "{how:?}");
        assert_eq!(Trainers::read(dir.path(), 0, "j", 2).unwrap().unwrap().pass, 2);
    }
    let dir = tempfile::tempdir().unwrap();
    server_folder(dir.path());
    let record = server_dir(dir.path(), 0).join("trainers.json");
    std::fs::write(&record, r#"{"job":"j","closed":[7],"pass":1,"ended":[]}"#).unwrap();
    let err = Trainers::read(dir.path(), 0, "j", 2).unwrap_err().to_string();
    assert!(err.contains("names trainer 7, but the job has 2"), "{err}");
    std::fs::write(&record, format!(r#"{{"job":"j","closed":[],"pass":{},"ended":[]}}"#, u64::MAX)).unwrap();
    assert!(Trainers::read(dir.path(), 0, "j", 2).unwrap_err().to_string().contains("pass"));
    std::fs::write(&record, r#"{"job":"other","closed":[0,1],"pass":1,"ended":[]}"#).unwrap();
    assert_eq!(Trainers::read(dir.path(), 0, "j", 2).unwrap(), None, "another job's record is not this one's");
}

/// A damaged newest checkpoint (its entry or its shard file) falls back to the one before; an
/// entry with numbers that would wrap is damaged too; another job's checkpoint is never taken.
#[test]
fn a_damaged_newest_checkpoint_falls_back_and_another_jobs_is_never_loaded() {
    let files = ["entry.json", "server-0.shard"];
    for (file, how) in files.iter().flat_map(|f| DAMAGES.iter().map(move |h| (*f, *h))) {
        let dir = tempfile::tempdir().unwrap();
        server_folder(dir.path());
        let newest = server_dir(dir.path(), 0).join("ckpt-000002").join(file);
        let outside = damage(&newest, how, 256 << 20);
        let d = dir.path().to_path_buf();
        let (entry, _) = within("loading", move || load_latest(&d, 0, "j")).unwrap();
        assert_eq!((entry.seq, entry.version), (1, 5), "{file} {how:?}: the previous checkpoint");
        assert_eq!(std::fs::read(&outside).unwrap(), b"not yours");
    }
    let dir = tempfile::tempdir().unwrap();
    server_folder(dir.path());
    let entry = server_dir(dir.path(), 0).join("ckpt-000002/entry.json");
    let text = std::fs::read_to_string(&entry).unwrap();
    let at = text.find("\"version\": 9").expect("pretty JSON");
    std::fs::write(&entry, format!("{}\"version\": {}{}", &text[..at], u64::MAX, &text[at + 12..])).unwrap();
    assert_eq!(load_latest(dir.path(), 0, "j").unwrap().0.version, 5, "a version that would wrap is damage");
    // Every checkpoint of this job damaged, another job's intact: none is loaded.
    let other = tempfile::tempdir().unwrap();
    Checkpointer::new(policy(other.path()), 0, Fence { job: "old".into(), epoch: 0 })
        .unwrap()
        .write(Cut::of(&small_shard(), 3))
        .unwrap();
    let mut c = Checkpointer::new(policy(other.path()), 0, Fence { job: "j".into(), epoch: 0 }).unwrap();
    c.write(Cut::of(&small_shard(), 4)).unwrap();
    std::fs::write(server_dir(other.path(), 0).join("ckpt-000002/server-0.shard"), b"torn").unwrap();
    let err = load_latest(other.path(), 0, "j").map(|(e, _)| e).unwrap_err().to_string();
    assert!(err.contains("no readable checkpoint of server 0 of job 'j'") && err.contains("\"old\""), "{err}");
}

/// A shard file whose header lies (a zero block size, sizes beyond the file) is refused by its
/// reader before anything is allocated from the header.
#[test]
fn a_shard_header_that_lies_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _, _) = oar::persist::checkpoint::write_shard(&small_shard(), dir.path()).unwrap();
    let path = dir.path().join(file);
    let good = std::fs::read(&path).unwrap();
    let hlen = u64::from_le_bytes(good[8..16].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&good[16..16 + hlen]).unwrap();
    let rewrite = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut h = header.clone();
        edit(&mut h);
        let json = serde_json::to_vec(&h).unwrap();
        let mut bytes = good[..8].to_vec();
        bytes.extend((json.len() as u64).to_le_bytes());
        bytes.extend(&json);
        bytes.extend(&good[16 + hlen..good.len() - 4]);
        let crc = crc32fast::hash(&bytes);
        bytes.extend(crc.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        oar::persist::checkpoint::read_shard(&path).map(|_| ()).unwrap_err().to_string()
    };
    let err = rewrite(&|h| h["spec"]["dense"]["block_size"] = 0.into());
    assert!(err.contains("block_size must be positive"), "{err}");
    let err = rewrite(&|h| h["sparse_rows"][0] = (1u64 << 40).into());
    assert!(err.contains("the header describes"), "{err}");
    let err = rewrite(&|h| h["sparse_rows"][0] = u64::MAX.into());
    assert!(err.contains("sizes beyond any model"), "{err}");
    let err = rewrite(&|h| h["spec"]["sparse"][0]["dim"] = (1u64 << 20).into());
    assert!(err.contains("wider sparse tables"), "{err}");
    let err = rewrite(&|h| h["server_index"] = 5.into());
    assert!(err.contains("server 5 of 1"), "{err}");
}

/// A background checkpoint's shard is the one its entry records (size and CRC-32): another
/// checkpoint's file put in its place is skipped as damaged, as a torn one is, and the previous
/// checkpoint loaded. It was loaded as the newer one: the updates between them lost, and the
/// newer one's ledgers answering their resends as repeats.
#[test]
fn a_checkpoint_holding_another_checkpoints_shard_falls_back_to_the_previous() {
    let dir = tempfile::tempdir().unwrap();
    let shard = small_shard();
    let mut c = Checkpointer::new(policy(dir.path()), 0, Fence { job: "j".into(), epoch: 1 }).unwrap();
    let mut rows = vec![0.0; 10];
    for version in 1..=3u64 {
        // A row more each time: each checkpoint's shard differs.
        shard.sparse[0].pull(&[100 + version], &mut rows, true).unwrap();
        c.write(Cut::of(&shard, version)).unwrap();
    }
    let ckpt = |seq: u64| server_dir(dir.path(), 0).join(format!("ckpt-{seq:06}")).join("server-0.shard");
    std::fs::copy(ckpt(1), ckpt(3)).unwrap();
    let (entry, loaded) = load_latest(dir.path(), 0, "j").unwrap();
    assert_eq!((entry.seq, entry.version, loaded.sparse[0].len()), (2, 2, 5));
}

/// A saved model's shard files are the ones its manifest records: another job's shard, or
/// another pass's, put in a pass's place is refused naming it (another job's was evaluated as
/// this model, exit 0), and a manifest whose spec claims more than its files hold is refused
/// before anything is allocated from it (`oar eval` allocated until the machine ran out).
#[test]
fn a_saved_models_shards_must_be_the_ones_its_manifest_records() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(dir.path(), 1, 2000, 200);
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn.toml");
    let (mine, other) = (dir.path().join("mine"), dir.path().join("other"));
    for (out, seed, passes) in [(&mine, "1", "2"), (&other, "2", "1")] {
        let args = ["train", "--config", &s(&job), "--train", &s(&train), "--passes", passes, "--seed", seed];
        let o = oar(&[&args[..], &["--output", &s(out)]].concat());
        assert!(o.status.success(), "{}", text(&o));
    }
    // Under a 4 GB address space: a reader that allocates what the manifest claims fails
    // at once instead of filling the machine.
    let eval = |model: &Path| {
        let oar = env!("CARGO_BIN_EXE_oar");
        let command = format!("ulimit -v 4000000; exec {oar} eval --model {} --data {}", s(model), s(&test));
        let o = std::process::Command::new("bash").args(["-c", &command]).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default().to_string())
    };
    assert!(eval(&mine).0, "the model as saved");
    let shard = mine.join("pass-0002/server-0.shard");
    let good = std::fs::read(&shard).unwrap();
    for (from, what) in
        [(other.join("pass-0001/server-0.shard"), "another job's"), (mine.join("pass-0001/server-0.shard"), "pass 1's")]
    {
        std::fs::copy(&from, &shard).unwrap();
        let (ok, err) = eval(&mine);
        assert!(
            !ok && err.starts_with("oar: error:") && err.contains("server-0.shard") && err.contains("its record"),
            "{what}: {err}"
        );
    }
    std::fs::write(&shard, good).unwrap();
    assert!(eval(&mine).0, "the model restored");
    let manifest = mine.join("pass-0002/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    // A command in the manifest's reader runs only when asked (it ran, announced by one line
    // that a carriage return and escape codes in the command could hide), and is said escaped.
    let mut piped = m.clone();
    let planted = dir.path().join("planted");
    let command = format!("touch {}; cat #\r\x1b[2K", planted.display());
    piped["model"]["data"]["pipe_command"] = command.clone().into();
    std::fs::write(&manifest, serde_json::to_vec(&piped).unwrap()).unwrap();
    for verb in [&["eval"][..], &["predict", "--out", &s(&dir.path().join("scores"))]] {
        let o = oar(&[verb, &["--model", &s(&mine), "--data", &s(&test)]].concat());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            text(&o).contains("--trust-pipe-command") && text(&o).contains(&format!("{command:?}")),
            "{}",
            text(&o)
        );
        assert!(!planted.exists(), "{verb:?} ran the manifest's command");
    }
    let o = oar(&["eval", "--model", &s(&mine), "--data", &s(&test), "--trust-pipe-command"]);
    assert!(o.status.success() && planted.exists(), "{}", text(&o));
    assert!(text(&o).contains(&format!("the saved model's pipe_command {command:?}")), "{}", text(&o));
    assert!(!text(&o).contains('\x1b'), "{}", text(&o));
    // A pass count at u32::MAX: nothing to resume (the next pass wrapped to 0 and trained).
    let mut last = m.clone();
    last["pass"] = u32::MAX.into();
    std::fs::write(&manifest, serde_json::to_vec(&last).unwrap()).unwrap();
    let args = ["train", "--config", &s(&job), "--train", &s(&train), "--passes", "3", "--resume", &s(&mine)];
    let o = oar(&args);
    assert!(!o.status.success() && text(&o).contains("has 4294967295 pass(es) already"), "{}", text(&o));
    m["spec"]["dense"]["params"][0]["len"] = 1_000_000_000_000u64.into();
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    let (ok, err) = eval(&mine);
    assert!(!ok && err.contains("manifest.json") && err.contains("more than its shard files"), "{err}");
}

#[test]
fn a_damaged_position_record_is_an_error_naming_it_and_a_link_is_never_written_through() {
    let start = |pass: u32| Position {
        job: "j".into(),
        trainer: 0,
        first_pass: 1,
        pass,
        step: 4,
        samples: 10,
        trained: 10,
        finished: false,
        order: None,
    };
    for how in DAMAGES {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("checkpoints");
        drop(PositionLog::create(&folder, start(1)).unwrap());
        let file = Position::path(&folder, 0);
        let outside = damage(&file, how, 512);
        let f = folder.clone();
        let read = within("reading a position", move || Position::load(&f, "j", 0));
        match how {
            // An empty record is no record: a trainer killed before its first step.
            Damage::Empty => assert!(read.is_err() || read.as_ref().unwrap().is_none()),
            _ => assert_names(&read.unwrap_err().to_string(), "trainer-0.position"),
        }
        let f = folder.clone();
        let created = within("recording a position", move || PositionLog::create(&f, start(1)).map(drop));
        if matches!(how, Damage::Link | Damage::Pipe) {
            assert_names(&created.unwrap_err().to_string(), "trainer-0.position");
        }
        assert_eq!(std::fs::read(&outside).unwrap(), b"not yours", "{how:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    drop(PositionLog::create(dir.path(), start(999)).unwrap());
    let pos = Position::load(dir.path(), "j", 0).unwrap().unwrap();
    let err = pos.check_passes(dir.path(), 1).unwrap_err().to_string();
    assert!(err.contains("the record is in pass 999, but this run has passes 1..=1"), "{err}");
}

/// The processes that read these files at start fail with one clear line: a server whose claim
/// is a named pipe (it would hang at start), a server whose record names a trainer the job
/// does not have (it would exit 0 at once), a trainer whose position is a link (its target
/// would be overwritten) or of pass 999 (it would exit 0 having trained nothing).
#[test]
fn processes_refuse_hostile_restart_files_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("out/checkpoints");
    server_folder(&ckpt);
    let port = free_ports(1).to_string();
    let (port2, ckpt2) = (port.clone(), ckpt.clone());
    let server = move |fault_file: &str| {
        let (port, ckpt) = (&port2, &ckpt2);
        let args = ["pserver", "--recoverable", "--job", "j", "--host", "127.0.0.1", "--port", port, "--index", "0"];
        let dir_arg = ckpt.display().to_string();
        let out = oar(&[&args[..], &["--num-servers", "1", "--trainers", "2", "--checkpoint-dir", &dir_arg]].concat());
        assert!(!out.status.success(), "{fault_file}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default().to_string();
        assert!(err.starts_with("oar: error:") && err.contains(fault_file), "{err}");
        err
    };
    let fence = server_dir(&ckpt, 0).join("fence.json");
    std::fs::remove_file(&fence).unwrap();
    mkfifo(&fence);
    let server2 = server.clone();
    let err = within("a server over a piped fence", move || server2("fence.json"));
    assert!(err.contains("named pipe"), "{err}");
    std::fs::remove_file(&fence).unwrap();
    Checkpointer::new(policy(&ckpt), 0, Fence { job: "j".into(), epoch: 1 }).unwrap();
    std::fs::write(server_dir(&ckpt, 0).join("trainers.json"), r#"{"job":"j","closed":[0,1,2],"pass":1,"ended":[]}"#)
        .unwrap();
    server("trainers.json");

    let (train, _) = gen_data(&dir.path().join("data"), 1, 400, 0);
    let trainer = |what: &str, extra: &[&str]| {
        let (train, out) = (train.display().to_string(), dir.path().join("out").display().to_string());
        let addr = format!("127.0.0.1:{port}");
        let args = ["train", "--recoverable", "--job", "j", "--servers", &addr, "--train", &train, "--output", &out];
        let run = oar(&[&args[..], extra].concat());
        assert!(!run.status.success(), "{what}: {}", text(&run));
        let err = String::from_utf8_lossy(&run.stderr).lines().last().unwrap_or_default().to_string();
        assert!(err.starts_with("oar: error:") && err.contains("trainer-0.position"), "{what}: {err}");
        err
    };
    let position = Position::path(&ckpt, 0);
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, b"not yours").unwrap();
    std::os::unix::fs::symlink(&outside, &position).unwrap();
    let err = trainer("a linked position", &[]);
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read(&outside).unwrap(), b"not yours");
    std::fs::remove_file(&position).unwrap();
    let record = |pass: u32, samples: u64| {
        let p = Position {
            job: "j".into(),
            trainer: 0,
            first_pass: 1,
            pass,
            step: samples / 50,
            samples,
            trained: samples,
            finished: false,
            order: None,
        };
        drop(PositionLog::create(&ckpt, p));
    };
    record(999, 0);
    let err = trainer("a position of pass 999", &[]);
    assert!(err.contains("pass 999"), "{err}");
    // A record of samples read in the files' order, rejoined by a run that shuffles: skipping
    // that many of the shuffled lines would skip other samples (and train some twice).
    record(1, 100);
    let err = trainer("a position read in another order", &["--shuffle"]);
    assert!(err.contains("read in the files' order, but this run reads them shuffled by seed"), "{err}");
}

/// Outputs are never written through a symbolic link planted at their names: a file written
/// whole replaces the link (`meta.json`, a picture), and one written as it goes (a generated
/// part, a log, `metrics.csv`) refuses it with one line naming it. Before, each was written
/// into whatever the link named.
#[test]
fn outputs_are_never_written_through_a_link_at_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let victim = |name: &str| {
        let v = dir.path().join(name);
        std::fs::write(&v, "precious\n").unwrap();
        v
    };
    let intact =
        |v: &Path| assert_eq!(std::fs::read_to_string(v).unwrap(), "precious\n", "{} was written", v.display());
    // `oar gen`: meta.json is replaced; a part is refused.
    let gen = dir.path().join("gen");
    std::fs::create_dir_all(&gen).unwrap();
    let meta = victim("meta-victim");
    std::os::unix::fs::symlink(&meta, gen.join("meta.json")).unwrap();
    let args = ["gen", "criteo", "--lines", "200", "--test-lines", "20", "--parts", "1", "--out", &s(&gen)];
    let o = oar(&args);
    assert!(o.status.success(), "{}", text(&o));
    intact(&meta);
    assert!(!std::fs::symlink_metadata(gen.join("meta.json")).unwrap().file_type().is_symlink());
    let part = victim("part-victim");
    std::fs::remove_file(gen.join("train/part-00000")).unwrap();
    std::os::unix::fs::symlink(&part, gen.join("train/part-00000")).unwrap();
    let o = oar(&args);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("a symbolic link: oar does not write through one"), "{}", text(&o));
    intact(&part);
    // `oar train --output`: a link at metrics.csv is refused before training.
    let (train, out) = (gen.join("train"), dir.path().join("out"));
    std::fs::create_dir_all(&out).unwrap();
    let csv = victim("csv-victim");
    std::os::unix::fs::symlink(&csv, out.join("metrics.csv")).unwrap();
    std::fs::remove_file(&part).unwrap();
    std::fs::remove_file(gen.join("train/part-00000")).unwrap();
    assert!(oar(&args).status.success());
    let o = oar(&["train", "--train", &s(&train), "--hidden", "4", "--output", &s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("metrics.csv") && text(&o).contains("symbolic link"), "{}", text(&o));
    intact(&csv);
    // A pass folder that is a link: the save refuses it.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let linked = dir.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&elsewhere, linked.join("pass-0001")).unwrap();
    let o = oar(&["train", "--train", &s(&train), "--hidden", "4", "--output", &s(&linked)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("pass-0001 is a symbolic link"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was saved through the link");
    // A save for serving of a local online job into a linked `serving` folder: refused, as
    // servers refuse one outside their --save-root; the files went where the link led.
    let stream = dir.path().join("stream");
    let o = oar(&["gen", "stream", "--days", "1", "--lines-per-day", "300", "--parts", "1", "--out", &s(&stream)]);
    assert!(o.status.success(), "{}", text(&o));
    let online = dir.path().join("online");
    std::fs::create_dir_all(&online).unwrap();
    std::os::unix::fs::symlink(&elsewhere, online.join("serving")).unwrap();
    let days = ["--online", &s(&stream), "--days", "20260101..20260101", "--passes-per-day", "1", "--delta-every", "1"];
    let o = oar(&[&["train", "--is-local", "--hidden", "4", "--output", &s(&online)][..], &days].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("serving is a symbolic link"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was saved through the link");
    // A trainer's TensorBoard folder that is a link: refused, where the events went through it.
    let board = dir.path().join("board");
    std::fs::create_dir_all(&board).unwrap();
    std::os::unix::fs::symlink(&elsewhere, board.join("trainer-0")).unwrap();
    let o = oar(&["train", "--train", &s(&train), "--hidden", "4", "--tensorboard", &s(&board)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("trainer-0 is a symbolic link"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "no events were written through the link");
    // `oar plot --out`: the link is replaced by the picture.
    std::fs::remove_file(out.join("metrics.csv")).unwrap();
    let o = oar(&["train", "--train", &s(&train), "--hidden", "4", "--output", &s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let png = victim("png-victim");
    let link = dir.path().join("curves.png");
    std::os::unix::fs::symlink(&png, &link).unwrap();
    let o = oar(&["plot", "--metrics", &s(&out.join("metrics.csv")), "--out", &s(&link)]);
    assert!(o.status.success(), "{}", text(&o));
    intact(&png);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_file());
}
