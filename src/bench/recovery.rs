//! `oar bench --recovery`: what surviving a server or a trainer costs, on real processes. Four
//! kinds of 2 x 2 async runs of the CTR-DNN over the same data, in turn so the machine's drift
//! hits each alike: no checkpoints; background checkpoints every `every` seconds; the same with
//! server 1 killed (SIGKILL, by `OAR_FAULT`) when it has applied half the pass's updates, then
//! restarted from its newest checkpoint by `--max-restarts 1`; and the same with trainer 1
//! killed at half its steps, then restarted from its recorded position. Prints the
//! checkpoints' throughput cost, the time from each kill to training going on, the updates the
//! restarted shard lost, and the test AUCs against the undisturbed runs'.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::protocol::Mode;
use crate::run::launch::{LaunchConfig, LaunchSummary};

/// What to run.
pub struct RecoveryConfig {
    /// A folder with `train/` and `test/`.
    pub data: PathBuf,
    /// Runs of each kind.
    pub runs: usize,
    /// Seconds between checkpoints.
    pub every: f64,
    /// The `oar` binary.
    pub exe: PathBuf,
}

/// One killed run's recovery figures.
struct Recovery {
    /// Seconds from a trainer losing the server to its first answered request after the restart
    /// (the slowest trainer).
    resumed_after: f64,
    /// Updates of the killed shard since its checkpoint, lost.
    lost_updates: u64,
}

fn launch(
    config: &RecoveryConfig,
    logs: &Path,
    out: Option<&Path>,
    fault: Option<&str>,
) -> anyhow::Result<LaunchSummary> {
    let _ = std::fs::remove_dir_all(logs);
    if let Some(o) = out {
        let _ = std::fs::remove_dir_all(o);
    }
    crate::run::launch::run(&LaunchConfig {
        output: out.map(Path::to_path_buf),
        checkpoint_every: out.map(|_| config.every),
        max_restarts: fault.is_some() as usize,
        child_env: fault.map(|f| vec![("OAR_FAULT".to_string(), f.to_string())]).unwrap_or_default(),
        ..super::two_by_two(Mode::Async, &config.data, &config.exe, logs)
    })
}

/// The number after `key=` in a log line.
fn field(line: &str, key: &str) -> Option<f64> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..].split(|c: char| c.is_whitespace() || c == ',').next()?.parse().ok()
}

/// Reads a killed run's logs: the trainers' "server 1 is back" waits and the restarted
/// server's checkpoint version.
fn recovery(logs: &Path, killed_at: u64) -> anyhow::Result<Recovery> {
    let mut resumed_after: f64 = 0.0;
    for w in 0..2 {
        let path = logs.join(format!("worker.{w}.log"));
        let log = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let back = log.lines().find(|l| l.contains("server 1 is back")).context("a trainer never reconnected")?;
        resumed_after = resumed_after.max(field(back, "seconds").context("no seconds= in the reconnect line")?);
    }
    let path = logs.join("server.1.epoch-1.log");
    let log = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let resumed =
        log.lines().find(|l| l.contains("resumed shard from a checkpoint")).context("no checkpoint loaded")?;
    let version = field(resumed, "version").context("no version= in the resume line")? as u64;
    Ok(Recovery { resumed_after, lost_updates: killed_at.saturating_sub(version) })
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// CPU seconds the servers' checkpoint threads used in a run (their `cpu_seconds=` lines).
fn checkpoint_cpu(logs: &Path) -> anyhow::Result<f64> {
    let mut cpu = 0.0;
    for s in 0..2 {
        let path = logs.join(format!("server.{s}.log"));
        let log = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        cpu += log
            .lines()
            .filter(|l| l.contains("checkpoint written"))
            .filter_map(|l| field(l, "cpu_seconds"))
            .sum::<f64>();
    }
    Ok(cpu)
}

/// Seconds of the day of a log line's timestamp (`2026-11-23T12:38:19.165886Z ...`).
fn clock(line: &str) -> Option<f64> {
    let time = line.split_whitespace().next()?.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':').map(|p| p.parse::<f64>().ok());
    Some(parts.next()?? * 3600.0 + parts.next()?? * 60.0 + parts.next()??)
}

/// Seconds from server 0 losing trainer 1 to trainer 1 connecting again (its restart).
fn trainer_rejoined_after(logs: &Path) -> anyhow::Result<f64> {
    let path = logs.join("server.0.log");
    let log = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let at = |what: &str| -> anyhow::Result<f64> {
        let line =
            log.lines().find(|l| l.contains(what)).with_context(|| format!("no '{what}' in {}", path.display()))?;
        clock(line).with_context(|| format!("no timestamp on '{line}'"))
    };
    let (lost, back) = (at("trainer 1 disconnected without closing")?, at("trainer 1 rejoined")?);
    Ok((back - lost).rem_euclid(86_400.0))
}

/// Runs the benchmark and prints its table.
pub fn run(config: &RecoveryConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg!(feature = "faults"),
        "oar bench --recovery kills processes with planted faults: build oar with `--features faults`"
    );
    let files = crate::data::resolve_files(&config.data.join("train"))?;
    let mut lines = 0u64;
    for f in &files {
        let text = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        lines += text.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    // Async servers count one update per push: about one per 512 lines.
    let kill_at = (lines / 512 / 2).max(1);
    let fault = format!("server1:kill@version={kill_at}");
    // Each trainer takes one 512-line batch per step.
    let trainer_fault = format!("trainer1:kill@step={}", (lines / 2 / 512 / 2).max(1));
    println!(
        "recovery: 2 servers x 2 trainers async over {} ({lines} lines), {} runs of each kind in turn",
        config.data.display(),
        config.runs
    );
    let tmp = std::env::temp_dir().join(format!("oar-bench-recovery-{}", std::process::id()));
    let (logs, out) = (tmp.join("logs"), tmp.join("out"));
    let (mut plain, mut checkpointed, mut killed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut recoveries, mut trainer_killed, mut rejoins) = (Vec::new(), Vec::new(), Vec::new());
    // The checkpoint threads' CPU time as a share of the machine's over the run: what they take
    // from training on a busy machine, without the run-to-run noise of throughput.
    let mut cpu_shares = Vec::new();
    for run in 0..config.runs {
        let p = launch(config, &logs, None, None)?;
        let c = launch(config, &logs, Some(&out), None)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        cpu_shares.push(100.0 * checkpoint_cpu(&logs)? / (c.wall_seconds * cores));
        let k = launch(config, &logs, Some(&out), Some(&fault))?;
        anyhow::ensure!(k.restarts.len() == 1, "the killed run restarted {} servers, not 1", k.restarts.len());
        let r = recovery(&logs, kill_at)?;
        let t = launch(config, &logs, Some(&out), Some(&trainer_fault))?;
        anyhow::ensure!(
            t.restarts.len() == 1 && t.restarts[0].process == "worker 1",
            "the trainer-killed run restarted {:?}, not worker 1",
            t.restarts.iter().map(|r| &r.process).collect::<Vec<_>>()
        );
        // Counted at the source: what each server applied (or discarded as too stale), per
        // trainer, summed; every server sees every push.
        let handled = |s: &LaunchSummary| -> Vec<u64> {
            s.server_stats
                .iter()
                .map(|st| st.applied_samples.iter().zip(&st.discarded_samples).map(|(a, d)| a + d).sum())
                .collect()
        };
        let (t_handled, k_handled) = (handled(&t), handled(&k));
        anyhow::ensure!(
            t_handled.len() == 2 && t_handled.iter().all(|&n| n == lines),
            "after the trainer kill the servers handled {t_handled:?} samples, not {lines} each"
        );
        let rejoined = trainer_rejoined_after(&logs)?;
        let auc = |s: &LaunchSummary| s.test.as_ref().and_then(|t| t.auc).unwrap_or(f64::NAN);
        println!(
            "  run {}: no checkpoints {:.0} samples/s AUC {:.4} | checkpoints every {} s {:.0} samples/s AUC {:.4} | server 1 killed at update {kill_at}: AUC {:.4}, trainers going on {:.2} s after the kill, {} updates of its shard lost",
            run + 1,
            p.samples_per_sec,
            auc(&p),
            config.every,
            c.samples_per_sec,
            auc(&c),
            auc(&k),
            r.resumed_after,
            r.lost_updates
        );
        println!(
            "         server 1 killed: the servers hold {k_handled:?} samples (server 1's lost since its checkpoint: {})",
            lines.saturating_sub(k_handled.get(1).copied().unwrap_or_default())
        );
        println!(
            "         trainer 1 killed at half its steps: AUC {:.4}, back {:.2} s after the servers lost it, the servers handled {t_handled:?} samples (applied or discarded as stale, each once)",
            auc(&t),
            rejoined,
        );
        plain.push((p.samples_per_sec, auc(&p)));
        checkpointed.push((c.samples_per_sec, auc(&c)));
        killed.push((k.samples_per_sec, auc(&k)));
        recoveries.push(r);
        trainer_killed.push((t.samples_per_sec, auc(&t)));
        rejoins.push(rejoined);
    }
    let rate = |v: &[(f64, f64)]| super::median(v.iter().map(|x| x.0).collect());
    let aucs = |v: &[(f64, f64)]| mean_sd(&v.iter().map(|x| x.1).collect::<Vec<_>>());
    let overhead = 100.0 * (1.0 - rate(&checkpointed) / rate(&plain));
    println!(
        "checkpoints every {} s: {:.0} against {:.0} samples/s without (medians): {overhead:.1}% overhead (target <= 3%)",
        config.every,
        rate(&checkpointed),
        rate(&plain)
    );
    let (share, share_sd) = mean_sd(&cpu_shares);
    println!(
        "checkpoint threads' CPU time: {share:.2}% +- {share_sd:.2}% of the machine's over the checkpointed runs (the rest of a checkpoint's time is waiting for the disk)"
    );
    let waits: Vec<f64> = recoveries.iter().map(|r| r.resumed_after).collect();
    let lost: Vec<f64> = recoveries.iter().map(|r| r.lost_updates as f64).collect();
    println!(
        "kill -9 of server 1 -> trainers going on: mean {:.2} s, max {:.2} s; updates of its shard lost (since its checkpoint): mean {:.0}",
        mean_sd(&waits).0,
        waits.iter().cloned().fold(0.0, f64::max),
        mean_sd(&lost).0
    );
    let (ka, ks) = aucs(&killed);
    let (ca, cs) = aucs(&checkpointed);
    let (pa, ps) = aucs(&plain);
    let diffs: Vec<f64> = killed.iter().zip(&checkpointed).map(|(k, c)| k.1 - c.1).collect();
    let (d, ds) = mean_sd(&diffs);
    println!(
        "test AUC: server killed {ka:.4} +- {ks:.4}, undisturbed with checkpoints {ca:.4} +- {cs:.4}, without {pa:.4} +- {ps:.4}; killed - undisturbed {d:+.4} +- {ds:.4} (target within 0.002)"
    );
    let (ta, ts) = aucs(&trainer_killed);
    let diffs: Vec<f64> = trainer_killed.iter().zip(&checkpointed).map(|(k, c)| k.1 - c.1).collect();
    let (td, tds) = mean_sd(&diffs);
    println!(
        "kill -9 of trainer 1 -> its restart connected: mean {:.2} s, max {:.2} s; test AUC {ta:.4} +- {ts:.4}, killed - undisturbed {td:+.4} +- {tds:.4}",
        mean_sd(&rejoins).0,
        rejoins.iter().cloned().fold(0.0, f64::max)
    );
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
