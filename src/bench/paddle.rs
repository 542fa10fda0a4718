//! `oar bench --paddle PYTHON`: the CTR-DNN on 2 servers x 2 trainers, async, trained by oar and
//! by PaddlePaddle 3.0's parameter-server mode on the same data, in alternating rounds.
//!
//! Paddle runs `benches/paddle_ctr_dnn.py` (built in), the same model and optimizers, under the
//! environment Paddle's own launcher gives its processes (`TRAINING_ROLE`,
//! `PADDLE_PSERVERS_IP_PORT_LIST`, ...). Its data is converted to Paddle's MultiSlot text once,
//! before anything is timed, so its readers only `cat`. Both sides are timed from starting the
//! processes until the last trainer has finished, test evaluation included; oar's time also holds
//! its servers' exit, while Paddle's servers (which wait for their launcher) are stopped after
//! the clock: what differs favours Paddle. Both sides run Paddle's `SparseAdaGradSGDRule` for the
//! rows (oar's port of it), Adam for the dense layers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use anyhow::Context;

use super::median;
use crate::protocol::Mode;
use crate::table::{Optimizer, OptimizerKind};

/// PaddlePaddle's side of the comparison, built in so that `oar bench` needs no checkout.
const SCRIPT: &str = include_str!("../../benches/paddle_ctr_dnn.py");

/// Each Paddle trainer's `thread_num`. One is Paddle's best on 2 cores: with 2, a trainer took
/// 37.2 s for the 500,000 lines it took about 34 s for with 1 (2 x 2 on 2 cores), and Paddle
/// 3.0's evaluation then fails (`pool.size() ... expected 1`) and its push thread crashes.
const PADDLE_THREADS: usize = 1;

/// What to run.
pub struct PaddleConfig {
    /// A Python with PaddlePaddle 3.0 (`pip install paddlepaddle==3.0.0 "protobuf<5"`).
    pub python: PathBuf,
    /// A folder with `train/` and `test/`; generated when absent.
    pub data: Option<PathBuf>,
    /// Lines to generate when `data` is absent.
    pub lines: u64,
    /// Rounds; each runs both systems, the first of them alternating.
    pub rounds: usize,
    /// The `oar` binary.
    pub exe: PathBuf,
}

/// One job's figures.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    samples: u64,
    /// Samples over the time from starting the processes to the last trainer's end.
    end_to_end: f64,
    /// Samples over the slowest trainer's time in its training loop.
    in_loop: f64,
    auc: f64,
    /// Test samples evaluated, as the evaluation counted them (Paddle's: its AUC's buckets).
    test_samples: u64,
}

/// Runs the rounds and prints each job and the medians.
pub fn run(config: &PaddleConfig) -> anyhow::Result<()> {
    let version = paddle_version(&config.python)?;
    let tmp = tempfile::Builder::new().prefix("oar-bench-paddle-").tempdir()?;
    let data = super::bench_data(config.data.as_deref(), config.lines, 4, tmp.path())?;
    let script = tmp.path().join("paddle_ctr_dnn.py");
    std::fs::write(&script, SCRIPT)?;
    // A generous bound (Paddle trains about 20,000 samples/s here), so that a stuck step ends.
    let budget = Duration::from_secs(120) + Duration::from_millis(super::hosts::count_lines(&data.join("train"))?);
    let converted = tmp.path().join("multislot");
    let mut convert = Command::new(&config.python);
    convert.arg(&script).arg("convert").arg(&data).arg(&converted);
    bounded(&mut convert, budget, "converting the data to Paddle's MultiSlot text")?;
    let mut job: crate::train::job_config::JobConfig = toml::from_str(super::CTR_DNN)?;
    job.sparse_optimizer = Optimizer::paddle(OptimizerKind::SparseAdagrad);
    println!(
        "CTR-DNN on {}, 2 servers x 2 trainers, async, batch 512, 1 pass; PaddlePaddle {version} with {} thread(s) a trainer",
        data.display(),
        PADDLE_THREADS
    );
    println!(
        "| round | system | samples trained | samples/s end to end | samples/s in the training loops | test AUC | test samples |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=config.rounds.max(1) {
        let oar_first = round % 2 == 1;
        for oar_turn in [oar_first, !oar_first] {
            let logs = tmp.path().join(format!("logs-{round}-{}", if oar_turn { "oar" } else { "paddle" }));
            let r = if oar_turn {
                Run::from(super::train_cluster(Mode::Async, &data, &config.exe, &logs, job.clone(), "CTR-DNN")?)
            } else {
                paddle_job(&config.python, &script, &converted, &logs, budget)?
            };
            let name = if oar_turn { "oar" } else { "PaddlePaddle" };
            println!(
                "| {round} | {name} | {} | {:.0} | {:.0} | {:.4} | {} |",
                r.samples, r.end_to_end, r.in_loop, r.auc, r.test_samples
            );
            if oar_turn { &mut ours } else { &mut theirs }.push(r);
        }
    }
    print_medians(&ours, &theirs);
    Ok(())
}

impl From<super::training::TrainRun> for Run {
    fn from(r: super::training::TrainRun) -> Run {
        Run {
            samples: r.samples,
            end_to_end: r.samples_per_sec,
            in_loop: r.loop_samples_per_sec,
            auc: r.auc.unwrap_or(f64::NAN),
            test_samples: r.test_samples,
        }
    }
}

/// The medians of both sides' rounds and their ratios.
fn print_medians(ours: &[Run], theirs: &[Run]) {
    let m = |runs: &[Run], f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let (e2e, lp) =
        ((m(ours, |r| r.end_to_end), m(theirs, |r| r.end_to_end)), (m(ours, |r| r.in_loop), m(theirs, |r| r.in_loop)));
    println!(
        "medians: end to end oar {:.0}, PaddlePaddle {:.0} samples/s ({:.2}x); in the training loops {:.0} and {:.0} ({:.2}x); test AUC {:.4} and {:.4}",
        e2e.0,
        e2e.1,
        e2e.0 / e2e.1,
        lp.0,
        lp.1,
        lp.0 / lp.1,
        m(ours, |r| r.auc),
        m(theirs, |r| r.auc)
    );
}

/// Paddle's version, or an error saying how to get a Python that has it.
fn paddle_version(python: &Path) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("version");
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import sys, paddle; open(sys.argv[1], 'w').write(paddle.__version__)"]).arg(&out);
    let imported = bounded(&mut cmd, Duration::from_secs(120), "importing paddle");
    let version = std::fs::read_to_string(&out).unwrap_or_default();
    match imported {
        Ok(()) if !version.trim().is_empty() => Ok(version.trim().to_string()),
        Ok(()) => anyhow::bail!("--paddle {}: cannot import paddle (it said nothing)", python.display()),
        Err(e) if e.root_cause().downcast_ref::<std::io::Error>().is_some() => {
            anyhow::bail!("--paddle {}: cannot run it: {}", python.display(), e.root_cause())
        }
        Err(e) => anyhow::bail!(
            "--paddle {}: cannot import paddle (pip install paddlepaddle==3.0.0 \"protobuf<5\"): {e:#}",
            python.display()
        ),
    }
}

/// Runs `cmd` to its end within `limit`, its output discarded but its last line of errors kept
/// for the message; killed at the limit or on Ctrl-C.
fn bounded(cmd: &mut Command, limit: Duration, what: &str) -> anyhow::Result<()> {
    let errors = tempfile::tempfile()?;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(errors.try_clone()?).spawn()?;
    let deadline = Instant::now() + limit;
    let interrupted = crate::run::supervise::interrupt_flag();
    let status = loop {
        if let Some(status) = child.try_wait().with_context(|| format!("{what}: waiting"))? {
            break status;
        }
        let (late, stopped) = (Instant::now() > deadline, interrupted.load(Ordering::SeqCst));
        if late || stopped {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::ensure!(!stopped, "{what}: interrupted");
            anyhow::bail!("{what}: not done within {:.0} s", limit.as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.success() {
        return Ok(());
    }
    // Ctrl-C reaches the child too, which then fails with Python's KeyboardInterrupt.
    anyhow::ensure!(!interrupted.load(Ordering::SeqCst), "{what}: interrupted");
    use std::io::{Read, Seek};
    let mut errors = errors;
    let mut text = Vec::new();
    errors.seek(std::io::SeekFrom::Start(0)).and_then(|_| errors.read_to_end(&mut text))?;
    let text = String::from_utf8_lossy(&text);
    match text.lines().rev().map(str::trim).find(|l| !l.is_empty()) {
        Some(last) => anyhow::bail!("{what} failed ({status}): {last}"),
        None => anyhow::bail!("{what} failed ({status})"),
    }
}

/// The job's processes, killed if still running when it is dropped (an error or a timeout).
struct Processes(Vec<(String, Child)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn paddle_job(python: &Path, script: &Path, data: &Path, logs: &Path, budget: Duration) -> anyhow::Result<Run> {
    std::fs::create_dir_all(logs)?;
    let ports = free_ports(5)?;
    let env = paddle_env(&ports, &logs.join("gloo"));
    let started = Instant::now();
    let mut procs = Processes(Vec::new());
    for (role, i) in [("PSERVER", 0), ("PSERVER", 1), ("TRAINER", 0), ("TRAINER", 1)] {
        let name = format!("{}log.{i}", if role == "PSERVER" { "server" } else { "worker" });
        let log = std::fs::File::create(logs.join(&name))?;
        let port = ports[if role == "PSERVER" { i } else { 2 + i }];
        let mut command = Command::new(python);
        // Paddle writes files of its own (`*_train_desc.prototxt`, `http.log`) where it runs.
        command
            .current_dir(logs)
            .arg(script)
            .arg("train")
            .arg(data)
            .arg(PADDLE_THREADS.to_string())
            .envs(env.iter().cloned())
            .env("TRAINING_ROLE", role)
            .env("PADDLE_ROLE", role)
            .env("PADDLE_PORT", port.to_string())
            .env("PADDLE_TRAINER_ID", i.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Paddle's servers never exit on their own: they must not outlive a killed `oar bench`.
        // SAFETY: prctl is async-signal-safe and touches nothing of the parent's.
        unsafe {
            use std::os::unix::process::CommandExt;
            // The signal follows the thread that spawned the child: this one, which waits for it.
            command.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                -1 => Err(std::io::Error::last_os_error()),
                _ => Ok(()),
            });
        }
        let child = command.spawn().with_context(|| format!("starting PaddlePaddle's {name}"))?;
        procs.0.push((name, child));
    }
    wait_for_trainers(&mut procs, logs, started + budget)?;
    let wall = started.elapsed().as_secs_f64();
    drop(procs);
    let mut results = Vec::new();
    for i in 0..2 {
        let log = logs.join(format!("workerlog.{i}"));
        let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
        results.push(parse_result(&text).with_context(|| format!("PaddlePaddle trainer {i} ({})", logs.display()))?);
    }
    combine(&results, wall)
}

/// The environment Paddle's launcher gives every process of a 2 x 2 job on this machine:
/// servers on `ports[0..2]`, trainers on `ports[2..4]`, Gloo's rendezvous on `ports[4]`.
fn paddle_env(ports: &[u16], gloo: &Path) -> Vec<(String, String)> {
    let at = |p: &[u16]| p.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    [
        ("PADDLE_PSERVERS_IP_PORT_LIST", at(&ports[0..2])),
        ("PADDLE_TRAINER_ENDPOINTS", at(&ports[2..4])),
        ("PADDLE_TRAINERS_NUM", "2".into()),
        ("PADDLE_WITH_GLOO", "1".into()),
        ("PADDLE_GLOO_RENDEZVOUS", "3".into()),
        ("PADDLE_GLOO_HTTP_ENDPOINT", at(&ports[4..5])),
        ("PADDLE_GLOO_FS_PATH", gloo.display().to_string()),
        ("POD_IP", "127.0.0.1".into()),
        ("OMP_NUM_THREADS", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `n` ports free on 127.0.0.1 a moment ago. Paddle binds them itself a few seconds later; a
/// port taken in between fails that job, naming the process whose log says so.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?)
}

/// Waits until both trainers have exited; an error names the process that failed or is
/// missing at `deadline`, and its log.
fn wait_for_trainers(procs: &mut Processes, logs: &Path, deadline: Instant) -> anyhow::Result<()> {
    let interrupted = crate::run::supervise::interrupt_flag();
    loop {
        anyhow::ensure!(!interrupted.load(Ordering::SeqCst), "interrupted: PaddlePaddle's job stopped");
        let mut running = Vec::new();
        for (name, child) in &mut procs.0 {
            match child.try_wait().with_context(|| format!("waiting for PaddlePaddle's {name}"))? {
                Some(status) if !status.success() || name.starts_with("server") => anyhow::bail!(
                    "PaddlePaddle's {name} exited ({status}) before the trainers finished: see {}",
                    logs.join(&*name).display()
                ),
                Some(_) => {}
                None if name.starts_with("worker") => running.push(name.clone()),
                None => {}
            }
        }
        if running.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "PaddlePaddle's {} did not finish in time: see {}",
            running.join(" and "),
            logs.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `PADDLE_RESULT {json}` line a trainer of the script prints.
fn parse_result(log: &str) -> anyhow::Result<serde_json::Value> {
    let line =
        log.lines().rev().find_map(|l| l.strip_prefix("PADDLE_RESULT ")).context("no PADDLE_RESULT line in its log")?;
    Ok(serde_json::from_str(line)?)
}

/// Both trainers' results as one job's figures (`wall`: seconds from start to the last
/// trainer's end); the AUC is trainer 0's, which tests.
fn combine(results: &[serde_json::Value], wall: f64) -> anyhow::Result<Run> {
    let field = |r: &serde_json::Value, k: &str| r[k].as_f64().with_context(|| format!("no {k} in {r}"));
    let mut samples = 0.0;
    let mut slowest: f64 = 0.0;
    for r in results {
        samples += field(r, "samples")?;
        slowest = slowest.max(field(r, "train_seconds")?);
    }
    let tester = results.iter().find(|r| r["trainer"] == 0).context("no result from trainer 0")?;
    Ok(Run {
        samples: samples as u64,
        end_to_end: samples / wall,
        in_loop: samples / slowest,
        // null: the test set held one class.
        auc: match &tester["test_auc"] {
            serde_json::Value::Null if tester.get("test_auc").is_some() => f64::NAN,
            _ => field(tester, "test_auc")?,
        },
        test_samples: field(tester, "test_samples")? as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainers_result_is_its_last_result_line() {
        let log = "noise\nPADDLE_RESULT {\"trainer\": 1, \"samples\": 5}\nmore noise\n";
        assert_eq!(parse_result(log).unwrap()["samples"], 5);
        assert!(parse_result("I1201 nothing here").unwrap_err().to_string().contains("no PADDLE_RESULT"));
    }

    #[test]
    fn the_job_is_both_trainers_samples_over_the_wall_time_and_the_slowest_loop() {
        let r = [
            serde_json::json!({"trainer": 0, "samples": 500, "train_seconds": 4.0, "test_auc": 0.75, "test_samples": 9}),
            serde_json::json!({"trainer": 1, "samples": 300, "train_seconds": 5.0}),
        ];
        assert_eq!(
            combine(&r, 8.0).unwrap(),
            Run { samples: 800, end_to_end: 100.0, in_loop: 160.0, auc: 0.75, test_samples: 9 }
        );
        assert!(combine(&r[1..], 8.0).unwrap_err().to_string().contains("trainer 0"));
        // A test set of one class has no AUC (null); a result without the field is an error.
        let mut one_class = r.clone();
        one_class[0]["test_auc"] = serde_json::Value::Null;
        assert!(combine(&one_class, 8.0).unwrap().auc.is_nan());
        one_class[0].as_object_mut().unwrap().remove("test_auc");
        assert!(combine(&one_class, 8.0).unwrap_err().to_string().contains("no test_auc"));
    }

    #[test]
    fn paddles_processes_get_its_launchers_endpoints() {
        let env = paddle_env(&[1, 2, 3, 4, 5], Path::new("/g"));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PADDLE_PSERVERS_IP_PORT_LIST"), Some("127.0.0.1:1,127.0.0.1:2"));
        assert_eq!(get("PADDLE_TRAINER_ENDPOINTS"), Some("127.0.0.1:3,127.0.0.1:4"));
        assert_eq!(get("PADDLE_GLOO_HTTP_ENDPOINT"), Some("127.0.0.1:5"));
    }
}
