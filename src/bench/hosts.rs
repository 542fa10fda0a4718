//! `oar bench --hosts`: training across hosts that are not loopback ([`super::netns`]): 2
//! servers and 2 trainers, each in a namespace of its own, started through Paddle's Fleet
//! variables, in each `--modes` mode on links of each `--links` shape, for a sparse-heavy
//! model (the CTR-DNN) and a dense-heavy one (the CTR-DNN with three hidden layers of 1,024:
//! 2.1 M dense floats, 8.5 MB each way per step). Samples/s end to end, medians of `--runs`
//! rounds that alternate the cases, each beside the first's; bytes per sample as the servers
//! count their frames; packets the switch dropped; the round trip between a trainer's host and
//! a server's.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::delay::{round_trip, DelayLine};
use super::median;
use super::netns::{Hosts, Link};
use crate::protocol::Mode;

/// What `oar bench --hosts` measures.
#[derive(Clone, Debug)]
pub struct HostsConfig {
    /// A data set with `train/` (generated under a temporary folder when `None`).
    pub data: Option<PathBuf>,
    /// Lines to generate when `data` is `None`.
    pub lines: u64,
    /// The link shapes, each measured beside the others in every round.
    pub links: Vec<Link>,
    /// The modes, each run on every link in every round.
    pub modes: Vec<Mode>,
    /// Rounds.
    pub runs: usize,
    /// The `oar` binary the hosts run.
    pub exe: PathBuf,
}

/// One job across the hosts.
struct HostsRun {
    seconds: f64,
    /// Frame bytes the servers read and wrote.
    frame_bytes: u64,
    /// Packets the switch dropped on the hosts' links.
    dropped: u64,
    /// The median round trip from a trainer's host to a server's, before the job.
    round_trip: Duration,
}

/// The two models: (name, job file text).
fn models() -> [(&'static str, String); 2] {
    let ctr = super::ZOO.iter().find(|(name, _)| *name == "CTR-DNN").expect("the zoo has the CTR-DNN").1;
    let dense = ctr.replace("hidden = [400, 400, 400]", "hidden = [1024, 1024, 1024]");
    assert_ne!(dense, ctr, "the CTR-DNN's hidden layers are where the dense-heavy model widens them");
    [("CTR-DNN (sparse-heavy: 400x3)", ctr.to_string()), ("CTR-DNN 1024x3 (dense-heavy)", dense)]
}

/// Runs the measurement and prints one markdown table per model.
pub fn run(config: &HostsConfig) -> anyhow::Result<()> {
    anyhow::ensure!(!config.links.is_empty(), "--links names no link");
    anyhow::ensure!(!config.modes.is_empty(), "--modes names no mode");
    if let Some(m) = config.modes.iter().find(|m| **m == Mode::Local) {
        anyhow::bail!("--modes: {m} has no servers to put on other hosts (async, sync or geo)");
    }
    anyhow::ensure!(config.runs > 0, "--runs is 0");
    let tmp = std::env::temp_dir().join(format!("oar-bench-hosts-{}", std::process::id()));
    let result = measure(config, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// [`run`] with its temporary folder `tmp`.
fn measure(config: &HostsConfig, tmp: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(tmp)?;
    let data = super::bench_data(config.data.as_deref(), config.lines, tmp)?;
    let samples = count_lines(&data.join("train"))?;
    // The servers hold the job's master secret, each trainer a credential of its own.
    let master = crate::security::auth::Secret::generate();
    master.write_new(&tmp.join("master.secret"))?;
    for t in 0..2 {
        let credential = master.derive(
            "oar", // the default --job
            crate::security::auth::Identity::Trainer(t),
        )?;
        credential.write_new(&tmp.join(format!("trainer-{t}.secret")))?;
    }
    let modes: Vec<String> = config.modes.iter().map(Mode::to_string).collect();
    println!(
        "oar bench --hosts: 2 servers x 2 trainers ({}), each in a network namespace of its own; {samples} samples",
        modes.join(", ")
    );
    let cases: Vec<(Mode, &Link)> =
        config.modes.iter().flat_map(|&m| config.links.iter().map(move |l| (m, l))).collect();
    for (name, text) in models() {
        let job = tmp.join("job.toml");
        std::fs::write(&job, &text)?;
        let mut runs: Vec<Vec<HostsRun>> = cases.iter().map(|_| Vec::new()).collect();
        for round in 0..config.runs {
            for (c, &(mode, link)) in cases.iter().enumerate() {
                let hosts = Hosts::new(4, link).map_err(|why| {
                    anyhow::anyhow!(
                        "oar bench --hosts makes network namespaces (root, iproute2, nftables for loss): {why}"
                    )
                })?;
                let run = run_job(&hosts, link, mode, &config.exe, &job, &data, tmp)?;
                println!(
                    "    {name}, {mode}, {link}, round {}: {:.0} samples/s, {} packets lost, round trip {:.0} us",
                    round + 1,
                    samples as f64 / run.seconds,
                    run.dropped,
                    run.round_trip.as_secs_f64() * 1e6
                );
                runs[c].push(run);
            }
        }
        print_table(name, &cases, &runs, samples);
    }
    Ok(())
}

/// Lines in the files of `dir` (samples in a pass).
fn count_lines(dir: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for file in crate::data::resolve_files(dir)? {
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        n += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok(n)
}

/// The port servers listen on, and the one their delay lines listen on.
const PORT: u16 = 7164;
const LINE_PORT: u16 = 7165;

/// Where host `i` listens on `port`.
fn at(hosts: &Hosts, i: usize, port: u16) -> anyhow::Result<std::net::SocketAddr> {
    Ok(std::net::SocketAddr::new(hosts.addr(i).parse()?, port))
}

/// One job in `mode`: servers on hosts 1 and 2, trainers on 3 and 4, all through Fleet's variables;
/// with a delay, the trainers reach the servers through delay lines in the servers' hosts.
fn run_job(
    hosts: &Hosts,
    link: &Link,
    mode: Mode,
    exe: &Path,
    job: &Path,
    data: &Path,
    secrets: &Path,
) -> anyhow::Result<HostsRun> {
    let delay = link.delay_us.map(Duration::from_micros);
    let probe = delay.map(|d| anyhow::Ok((at(hosts, 1, 7301)?, d))).transpose()?;
    let round_trip = round_trip(Some(&hosts.ns(3)), Some(&hosts.ns(1)), at(hosts, 1, 7300)?, probe, 200)
        .context("measuring the round trip between hosts")?;
    let mut lines = Vec::new();
    for s in 1..=2 {
        if let Some(d) = delay {
            let line = DelayLine::start(Some(&hosts.ns(s)), at(hosts, s, LINE_PORT)?, at(hosts, s, PORT)?, d);
            lines.push(line.with_context(|| format!("starting a delay line in host {s}"))?);
        }
    }
    let list = |port| format!("{}:{port},{}:{port}", hosts.addr(1), hosts.addr(2));
    let trainers_list = list(if delay.is_some() { LINE_PORT } else { PORT });
    let common = [
        ("OAR_CONFIG", job.display().to_string()),
        ("OAR_TRAIN", data.join("train").display().to_string()),
        ("OAR_MODE", mode.to_string()),
        ("PADDLE_TRAINERS_NUM", "2".to_string()),
    ];
    let started = Instant::now();
    let spawn = |host: usize, role: Vec<(&'static str, String)>| -> anyhow::Result<Child> {
        let vars: Vec<(&str, String)> = common.iter().cloned().chain(role).collect();
        let mut c = hosts.command(host, exe, &["train"], &vars);
        c.stdin(Stdio::null());
        c.spawn().with_context(|| format!("starting {} on host {host}", exe.display()))
    };
    let mut servers = Vec::new();
    for s in 1..=2 {
        let key = ("OAR_SECRET_FILE", secrets.join("master.secret").display().to_string());
        let role = vec![
            ("TRAINING_ROLE", "PSERVER".into()),
            ("POD_IP", hosts.addr(s)),
            ("PADDLE_PORT", PORT.to_string()),
            ("PADDLE_PSERVERS_IP_PORT_LIST", list(PORT)),
            key,
        ];
        servers.push(spawn(s, role)?);
    }
    let mut trainers = Vec::new();
    for t in 0..2 {
        let key = ("OAR_SECRET_FILE", secrets.join(format!("trainer-{t}.secret")).display().to_string());
        let role = vec![
            ("TRAINING_ROLE", "TRAINER".into()),
            ("PADDLE_TRAINER_ID", t.to_string()),
            ("PADDLE_PSERVERS_IP_PORT_LIST", trainers_list.clone()),
            key,
        ];
        trainers.push(spawn(3 + t, role)?);
    }
    for (t, child) in trainers.into_iter().enumerate() {
        if let Err(e) = ended(child, &format!("trainer {t}")) {
            // A server that failed first is the cause: its error, not the trainer's.
            for (s, mut server) in servers.into_iter().enumerate() {
                if server.try_wait()?.is_some() {
                    ended(server, &format!("server {s}"))?;
                } else {
                    let _ = server.kill();
                }
            }
            return Err(e);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut frame_bytes = 0;
    for (s, child) in servers.into_iter().enumerate() {
        let out = ended(child, &format!("server {s}"))?;
        let line = out.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).context("a server printed no counters")?;
        let stats: crate::protocol::ServerStats = serde_json::from_str(line)?;
        frame_bytes += stats.frame_bytes_in + stats.frame_bytes_out;
    }
    let mut dropped = 0;
    for i in 1..=4 {
        dropped += hosts.dropped(i).map_err(|why| anyhow::anyhow!("counting lost packets: {why}"))?;
    }
    Ok(HostsRun { seconds, frame_bytes, dropped, round_trip })
}

/// Waits for `child`; its standard output, or an error with the end of what it wrote.
fn ended(child: Child, what: &str) -> anyhow::Result<String> {
    let o = child.wait_with_output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    let tail: Vec<&str> = err.lines().rev().take(5).collect();
    anyhow::ensure!(o.status.success(), "{what} failed: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The table of one model: per mode and link, the median round trip, samples/s, its ratio to
/// the first case's in the same rounds, bytes per sample and packets lost.
fn print_table(name: &str, cases: &[(Mode, &Link)], runs: &[Vec<HostsRun>], samples: u64) {
    println!("\n{name}\n");
    let (mode0, link0) = cases[0];
    println!(
        "| mode | link | round trip (median) | samples/s end to end (median) | vs {mode0} on {link0} (median of rounds) | bytes per sample | packets lost |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ((mode, link), rs) in cases.iter().zip(runs) {
        let rate = median(rs.iter().map(|r| samples as f64 / r.seconds).collect());
        let ratio = median(rs.iter().zip(&runs[0]).map(|(r, base)| base.seconds / r.seconds).collect());
        let bytes = median(rs.iter().map(|r| r.frame_bytes as f64 / samples as f64).collect());
        let lost = median(rs.iter().map(|r| r.dropped as f64).collect());
        let rtt = median(rs.iter().map(|r| r.round_trip.as_secs_f64() * 1e6).collect());
        println!("| {mode} | {link} | {rtt:.0} us | {rate:.0} | {ratio:.2}x | {bytes:.0} | {lost:.0} |");
    }
}
