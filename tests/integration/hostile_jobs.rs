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
    // Batches that fit the machine but not the process's address-space limit: refused with
    // the batch named, where the allocation aborted the process.
    let o = oar_limited(3 << 30, &[&local[..], &["--batch-size", "500000"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("lower batch_size or threads"), "{}", text(&o));
}
