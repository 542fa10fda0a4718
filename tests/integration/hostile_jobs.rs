//! Job files, settings and the tools around training (`oar plot`, `oar data`, `oar gen`,
//! `oar split`) given hostile input, end to end through the binary: each is refused in one line
//! naming the setting or file, where before it hung, aborted on allocation, or exited 0 with
//! something wrong or something destroyed.

use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::util::*;

/// Runs `oar args` with an address-space limit of `bytes` (as `prlimit --as` or a container
/// would set it).
fn oar_limited(bytes: u64, args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
    command.args(args).env_remove("OAR_LAUNCHED");
    // SAFETY: setrlimit is async-signal-safe, as a pre_exec hook must be.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command.output().expect("oar runs")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn settings_past_what_the_process_may_hold_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 200, 10);
    let train = train.display().to_string();
    let local = ["train", "--is-local", "--train", &train];
    // Local mode's delayed updates hold every held-back step's gradients: a million steps
    // took memory until the allocator aborted.
    let o = oar(&[&local[..], &["--sync-warmup", "0", "--delay", "1000000"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--delay 1000000: at most 1024 steps may be held back"), "{}", text(&o));
    // An admission filter of 2^32 cells (12 GiB) in local mode, which a server refused.
    let job = write(
        dir.path(),
        "filter.toml",
        "[model]\noutput = \"out\"\n\
         tables = [{ name = \"v\", dim = 1, entry = \"count_filter_entry:3\", filter_capacity = 4294967296 }]\n\
         layers = [{ name = \"e\", type = \"embedding\", table = \"v\" }, \
         { name = \"out\", type = \"reduce_sum\", input = \"e\", over = \"all\" }]\n",
    );
    let o = oar(&[&local[..], &["--config", &job]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("lower filter_capacity"), "{}", text(&o));
    // A value head on an output that is not a loss: the model minimized its own output
    // (loss -1e9 after 3 passes) and the job exited 0.
    let job = write(dir.path(), "value.toml", "[model]\nloss = \"value\"\n");
    let o = oar(&[&local[..], &["--config", &job]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("a value head minimizes a loss a layer computes"), "{}", text(&o));
    // The shorthand's counts on criteo data: another count than the format's was ignored (26
    // slots and 13 values trained) while the manifest recorded it.
    for (model, refused) in [
        ("slots = 5", "model.slots = 5: the criteo format has 26"),
        ("dense_features = 100000000000", "model.dense_features = 100000000000: the criteo format has 13"),
    ] {
        let job = write(dir.path(), "counts.toml", &format!("[model]\n{model}\nhidden = [8]\n"));
        let o = oar(&[&local[..], &["--config", &job]].concat());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(refused), "{}", text(&o));
    }
    // Batches that fit the machine but not the process's address-space limit: refused with
    // the batch named, where the allocation aborted the process.
    let o = oar_limited(3 << 30, &[&local[..], &["--batch-size", "500000"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("lower batch_size or threads"), "{}", text(&o));
    // A shuffled pass over endless short lines (a `pipe_command` that never ends) under the
    // same limit: the lines held, and their list, reach the shuffle's bound and are refused
    // naming shuffle_window, where the allocator aborted the process (counting the texts alone
    // let the held lines take twice what was counted).
    let endless = ["--shuffle", "--pipe-command", "yes '1	1'"];
    let o = oar_limited(3 << 30, &[&local[..], &endless[..]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("shuffling holds this trainer's lines") && text(&o).contains("--shuffle-window"),
        "{}",
        text(&o)
    );
}

/// The tools around training refuse what they used to do wrong with exit 0: an output over
/// their own input or a device, a non-finite value in the data they prepare, a part left empty
/// or left over from an earlier run.
#[test]
fn tools_refuse_to_destroy_their_input_or_write_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let csv =
        write(dir.path(), "m.csv", "trainer,pass,step,samples,seconds,kind,loss,auc\n0,1,50,100,1.0,steps,0.6,0.7\n");
    // `oar plot --out` its own input: the curves were replaced by the picture.
    let o = oar(&["plot", "--metrics", &csv, "--out", &csv]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is the input") && text(&o).contains("name another file"), "{}", text(&o));
    assert!(std::fs::read_to_string(&csv).unwrap().starts_with("trainer,"));
    let o = oar(&["plot", "--metrics", &csv, "--out", "/dev/null"]);
    assert!(text(&o).contains("a device is there, not a file to replace"), "{}", text(&o));
    // `oar data stats --out` a data file.
    let (train, _) = gen_data(&dir.path().join("data"), 1, 100, 10);
    let part = train.join("part-00000").display().to_string();
    let before = std::fs::read(&part).unwrap();
    let o = oar(&["data", "stats", "--data", &part, "--out", &part]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is the input"), "{}", text(&o));
    assert_eq!(std::fs::read(&part).unwrap(), before);

    // A NaN in UCI housing made a whole column NaN and a NaN test error, exit 0.
    let rows: String = (0..10).map(|k| format!("{}\n", vec![(k + 1).to_string(); 14].join(" "))).collect();
    let src = write(dir.path(), "housing.data", &rows.replacen("1 1 1 1", "1 1 1 NaN", 1));
    let o = oar(&["data", "prepare", "uci-housing", "--src", &src, "--out", &path("uci")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("housing.data:1: column 4 is \"NaN\", not a number within"), "{}", text(&o));

    // 5 lines a day in 4 parts were written 2, 2, 1, 0: a trainer then read no sample.
    let stream = path("stream");
    let o = oar(&["gen", "stream", "--days", "1", "--lines-per-day", "5", "--parts", "4", "--out", &stream]);
    assert!(o.status.success(), "{}", text(&o));
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
    let day = Path::new(&stream).join("20260101");
    let sizes: Vec<usize> = (0..4).map(|k| lines(&day.join(format!("part-{k:05}")))).collect();
    assert_eq!(sizes, [2, 1, 1, 1]);
    // Generated again with fewer parts: the old parts would be read with the new ones.
    let o = oar(&["gen", "criteo", "--lines", "400", "--parts", "4", "--out", &path("gen")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = oar(&["gen", "criteo", "--lines", "400", "--parts", "2", "--out", &path("gen")]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("holds part-00002 (2 part file(s) in all) from an earlier run"), "{}", text(&o));
}

/// Flags over a job file mean what they say: `--dense-optimizer adam_d2sum` over the file's
/// Adam runs Paddle's rule with its own settings (it ran with Adam's betas, exit 0), and
/// `--shuffle false` over a file that shuffles in a window turns shuffling off (it was refused
/// with advice to set shuffle = true).
#[test]
fn flags_over_a_job_file_change_a_rule_with_its_settings_and_turn_shuffling_off_with_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 200, 10);
    let (train, out) = (train.display().to_string(), dir.path().join("out"));
    let job = write(dir.path(), "job.toml", "[dense_optimizer]\nkind = \"adam\"\nlr = 0.002\n");
    let o = oar(&[
        "train",
        "--is-local",
        "--train",
        &train,
        "--config",
        &job,
        "--dense-optimizer",
        "adam_d2sum",
        "--output",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (manifest, _) = oar::persist::checkpoint::Manifest::find(&out).unwrap();
    assert_eq!(manifest.spec.dense.optimizer, oar::table::Optimizer::adam_d2sum(0.002), "the file's rate kept");

    let job = write(dir.path(), "shuffled.toml", "[train]\nshuffle = true\nshuffle_window = 1000\n");
    let o = oar(&["train", "--is-local", "--train", &train, "--config", &job, "--shuffle", "false"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("shuffle=off"), "{}", text(&o));
}
