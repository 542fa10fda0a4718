//! `oar bench --hosts`: training across hosts that are not loopback ([`super::netns`]): S
//! servers and N trainers (2 and 2 unless asked), each in a namespace of its own, started
//! through Paddle's Fleet variables, in each `--modes` mode on links of each `--links` shape,
//! for a sparse-heavy model (the CTR-DNN) and a dense-heavy one (the CTR-DNN with three hidden
//! layers of 1,024: 2.1 M dense floats, 8.5 MB each way per step), async without the
//! synchronous warm-up. Samples/s end to end, medians of `--runs` rounds that alternate the
//! cases, each beside the first's; bytes per sample as the servers count their frames; CPU
//! seconds per sample and the kernel's share of them; packets the switch and the shapers
//! dropped; the round trip between a trainer's host and a server's; what a step's bytes take
//! on the link alone ([`super::transfer`]); and the scale model's samples/s from those costs.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::delay::{round_trip, DelayLine};
use super::median;
use super::netns::{Hosts, Link, TcpCounts};
use super::scale::{predict, Costs, Shape, Way, PAYLOAD_SHARE};
use super::transfer::Sink;
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
    /// Servers, each on a host of its own.
    pub servers: usize,
    /// Trainers, each on a host of its own.
    pub trainers: usize,
    /// Only the models whose names hold one of these (`sparse-heavy`, `dense-heavy`); all when
    /// empty.
    pub models: Vec<String>,
    /// Rounds.
    pub runs: usize,
    /// The `oar` binary the hosts run.
    pub exe: PathBuf,
}

/// One job across the hosts.
struct HostsRun {
    seconds: f64,
    /// Frame bytes the servers read (sent to them) and wrote.
    bytes_to: u64,
    bytes_from: u64,
    /// CPU seconds the trainers and the servers used, all of each, and the kernel's of them.
    trainer_cpu: f64,
    server_cpu: f64,
    kernel_cpu: f64,
    /// Packets the switch dropped on the hosts' links (`+lossN`, cuts).
    dropped: u64,
    /// Packets the links' shapers dropped from their full queues.
    shaper_drops: u64,
    /// TCP's counts in all the hosts during the job: timeouts, segments sent and sent again.
    tcp: TcpCounts,
    /// The median round trip from a trainer's host to a server's, before the job.
    round_trip: Duration,
    /// Seconds a step's bytes took on the links alone, to the servers and from them, after the
    /// job.
    alone: [f64; 2],
}

/// A job's files and its size.
struct Job<'a> {
    /// The job file.
    file: &'a Path,
    /// The data set, with `train/`.
    data: &'a Path,
    /// Samples in a pass.
    samples: u64,
    /// Samples per step of a trainer.
    batch: usize,
}

/// The two models: (name, job file text).
fn models() -> [(&'static str, String); 2] {
    let ctr = super::CTR_DNN;
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
    anyhow::ensure!(config.servers > 0 && config.trainers > 0, "--servers and --trainers are at least 1");
    // Addresses end in the host's number on a /24, and every host is a namespace.
    anyhow::ensure!(config.servers + config.trainers <= 64, "--servers and --trainers: at most 64 hosts");
    let known = models().map(|(name, _)| name);
    if let Some(m) = config.models.iter().find(|m| !known.iter().any(|k| k.contains(m.as_str()))) {
        anyhow::bail!("--model {m:?}: --hosts has {}", known.join(" and "));
    }
    let tmp = std::env::temp_dir().join(format!("oar-bench-hosts-{}", std::process::id()));
    let result = measure(config, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// [`run`] with its temporary folder `tmp`.
fn measure(config: &HostsConfig, tmp: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(tmp)?;
    let data = super::bench_data(config.data.as_deref(), config.lines, config.trainers.max(4), tmp)?;
    let samples = count_lines(&data.join("train"))?;
    // The servers hold the job's master secret, each trainer a credential of its own.
    let master = crate::security::auth::Secret::generate();
    master.write_new(&tmp.join("master.secret"))?;
    for t in 0..config.trainers {
        let credential = master.derive(
            "oar", // the default --job
            crate::security::auth::Identity::Trainer(t as u64),
        )?;
        credential.write_new(&tmp.join(format!("trainer-{t}.secret")))?;
    }
    let modes: Vec<String> = config.modes.iter().map(Mode::to_string).collect();
    println!(
        "oar bench --hosts: {} servers x {} trainers ({}), each in a network namespace of its own; {samples} samples",
        config.servers,
        config.trainers,
        modes.join(", ")
    );
    let cases: Vec<(Mode, &Link)> =
        config.modes.iter().flat_map(|&m| config.links.iter().map(move |l| (m, l))).collect();
    let chosen = models()
        .into_iter()
        .filter(|(name, _)| config.models.is_empty() || config.models.iter().any(|m| name.contains(m.as_str())));
    for (name, text) in chosen {
        let file = tmp.join("job.toml");
        std::fs::write(&file, &text)?;
        let batch = toml::from_str::<crate::train::job_config::JobConfig>(&text)?.train.batch_size;
        let job = Job { file: &file, data: &data, samples, batch };
        let mut runs: Vec<Vec<HostsRun>> = cases.iter().map(|_| Vec::new()).collect();
        for round in 0..config.runs {
            for (c, &(mode, link)) in cases.iter().enumerate() {
                let hosts = Hosts::new(config.servers + config.trainers, link).map_err(|why| {
                    anyhow::anyhow!(
                        "oar bench --hosts makes network namespaces (root, iproute2, nftables for loss): {why}"
                    )
                })?;
                let run = run_job(&hosts, config, link, mode, &job, tmp)?;
                println!(
                    "    {name}, {mode}, {link}, round {}: {:.0} samples/s, {} packets lost, {} dropped by full queues, {} TCP timeouts, {:.1}% of TCP's segments sent again, round trip {:.0} us, a step's bytes alone {:.1} / {:.1} ms",
                    round + 1,
                    samples as f64 / run.seconds,
                    run.dropped,
                    run.shaper_drops,
                    run.tcp.timeouts,
                    100.0 * run.tcp.resent as f64 / run.tcp.sent.max(1) as f64,
                    run.round_trip.as_secs_f64() * 1e6,
                    run.alone[0] * 1e3,
                    run.alone[1] * 1e3
                );
                runs[c].push(run);
            }
        }
        let first = print_table(name, config, &cases, &runs, &job);
        print_projection(&first, job.batch as f64);
    }
    Ok(())
}

/// Lines in the files of `dir` (samples in a pass).
pub(super) fn count_lines(dir: &Path) -> anyhow::Result<u64> {
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

/// One job in `mode`: servers on hosts 1 to S, trainers on the next N, all through Fleet's
/// variables; with a delay, the trainers reach the servers through delay lines in the servers'
/// hosts.
fn run_job(
    hosts: &Hosts,
    config: &HostsConfig,
    link: &Link,
    mode: Mode,
    job: &Job,
    secrets: &Path,
) -> anyhow::Result<HostsRun> {
    let delay = link.delay_us.map(Duration::from_micros);
    let probe = delay.map(|d| anyhow::Ok((at(hosts, 1, 7301)?, d))).transpose()?;
    let (servers_n, trainers_n, exe) = (config.servers, config.trainers, &config.exe);
    let first_trainer = servers_n + 1;
    let round_trip = round_trip(Some(&hosts.ns(first_trainer)), Some(&hosts.ns(1)), at(hosts, 1, 7300)?, probe, 200)
        .context("measuring the round trip between hosts")?;
    let mut lines = Vec::new();
    for s in 1..=servers_n {
        if let Some(d) = delay {
            let line = DelayLine::start(Some(&hosts.ns(s)), at(hosts, s, LINE_PORT)?, at(hosts, s, PORT)?, d);
            lines.push(line.with_context(|| format!("starting a delay line in host {s}"))?);
        }
    }
    let list = |port| (1..=servers_n).map(|s| format!("{}:{port}", hosts.addr(s))).collect::<Vec<_>>().join(",");
    let trainers_list = list(if delay.is_some() { LINE_PORT } else { PORT });
    let common = [
        ("OAR_CONFIG", job.file.display().to_string()),
        ("OAR_TRAIN", job.data.join("train").display().to_string()),
        ("OAR_MODE", mode.to_string()),
        // Async steps from the first: the default synchronous warm-up (100 updates, each
        // trainer's batch split N ways) would be the whole of a short run.
        ("OAR_SYNC_WARMUP", "0".to_string()),
        ("PADDLE_TRAINERS_NUM", trainers_n.to_string()),
    ];
    let tcp = |hosts: &Hosts| -> anyhow::Result<TcpCounts> {
        let mut all = TcpCounts::default();
        for i in 1..=servers_n + trainers_n {
            all = all.plus(hosts.tcp_counts(i).map_err(anyhow::Error::msg)?);
        }
        Ok(all)
    };
    let tcp_before = tcp(hosts)?;
    let started = Instant::now();
    let spawn = |host: usize, role: Vec<(&'static str, String)>| -> anyhow::Result<Child> {
        let vars: Vec<(&str, String)> = common.iter().cloned().chain(role).collect();
        let mut c = hosts.command(host, exe, &["train"], &vars);
        c.stdin(Stdio::null());
        c.spawn().with_context(|| format!("starting {} on host {host}", exe.display()))
    };
    let mut servers = Vec::new();
    for s in 1..=servers_n {
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
    for t in 0..trainers_n {
        let key = ("OAR_SECRET_FILE", secrets.join(format!("trainer-{t}.secret")).display().to_string());
        let role = vec![
            ("TRAINING_ROLE", "TRAINER".into()),
            ("PADDLE_TRAINER_ID", t.to_string()),
            ("PADDLE_PSERVERS_IP_PORT_LIST", trainers_list.clone()),
            key,
        ];
        trainers.push(spawn(first_trainer + t, role)?);
    }
    let (mut trainer_cpu, mut trainer_kernel) = (0.0, 0.0);
    for (t, child) in trainers.into_iter().enumerate() {
        match ended(child, &format!("trainer {t}")) {
            Ok(done) => {
                trainer_cpu += done.cpu;
                trainer_kernel += done.kernel;
            }
            Err(e) => {
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
    }
    let seconds = started.elapsed().as_secs_f64();
    let (mut bytes_to, mut bytes_from, mut server_cpu, mut server_kernel) = (0, 0, 0.0, 0.0);
    for (s, child) in servers.into_iter().enumerate() {
        let done = ended(child, &format!("server {s}"))?;
        server_cpu += done.cpu;
        server_kernel += done.kernel;
        let line =
            done.stdout.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).context("a server printed no counters")?;
        let stats: crate::protocol::ServerStats = serde_json::from_str(line)?;
        bytes_to += stats.frame_bytes_in;
        bytes_from += stats.frame_bytes_out;
    }
    let (mut dropped, mut shaper_drops) = (0, 0);
    for i in 1..=servers_n + trainers_n {
        dropped += hosts.dropped(i).map_err(|why| anyhow::anyhow!("counting lost packets: {why}"))?;
        shaper_drops += hosts.shaper_drops(i).map_err(|why| anyhow::anyhow!("counting shaper drops: {why}"))?;
    }
    let tcp = tcp(hosts)?.since(tcp_before);
    let alone = step_alone(hosts, config, delay, job, [bytes_to, bytes_from], trainer_cpu - trainer_kernel)?;
    Ok(HostsRun {
        seconds,
        bytes_to,
        bytes_from,
        trainer_cpu,
        server_cpu,
        kernel_cpu: trainer_kernel + server_kernel,
        dropped,
        shaper_drops,
        tcp,
        round_trip,
        alone,
    })
}

/// What a step's bytes (`bytes` of `job`'s pass each way) take between the first trainer's
/// host and every server's, spread over them, alone, through delay lines when the link has one;
/// each transfer after a rest as long as a trainer's step computes (`user_cpu`, the trainers'
/// CPU seconds outside the kernel), as in training.
fn step_alone(
    hosts: &Hosts,
    config: &HostsConfig,
    delay: Option<Duration>,
    job: &Job,
    bytes: [u64; 2],
    user_cpu: f64,
) -> anyhow::Result<[f64; 2]> {
    let (samples, batch) = (job.samples as f64, job.batch as f64);
    let per_step = bytes.map(|b| (b as f64 / samples * batch).round() as u64);
    let rest = Duration::from_secs_f64((user_cpu / samples * batch).max(0.0));
    let sink =
        |s: usize| anyhow::Ok(Sink { ns: Some(hosts.ns(s)), at: at(hosts, s, 7302)?, line: Some(at(hosts, s, 7303)?) });
    let sinks = (1..=config.servers).map(sink).collect::<anyhow::Result<Vec<_>>>()?;
    let trainer = hosts.ns(config.servers + 1);
    super::transfer::measure(Some(&trainer), &sinks, delay, per_step, rest).context("timing a step's bytes on the link")
}

/// What a process left: its standard output and the CPU seconds it used, all and the kernel's.
struct Ended {
    stdout: String,
    cpu: f64,
    kernel: f64,
}

/// Waits for `child`; its standard output and CPU seconds, or an error with the end of what it
/// wrote. (`ip netns exec` runs the program in its own place, so the child is oar itself.)
fn ended(mut child: Child, what: &str) -> anyhow::Result<Ended> {
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let (ok, cpu, kernel) = match wait_with_cpu(child.id()) {
        Ok(done) => done,
        // Reaped already (try_wait): its status, without its CPU time.
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => (child.wait()?.success(), 0.0, 0.0),
        Err(e) => return Err(e).with_context(|| format!("waiting for {what}")),
    };
    let (stdout, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let tail: Vec<&str> = err.lines().rev().take(5).collect();
    anyhow::ensure!(ok, "{what} failed: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
    Ok(Ended { stdout, cpu, kernel })
}

/// Reads `pipe` to its end on a thread of its own (so that neither of a child's pipes fills
/// while the other is read); what it held.
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for process `pid`: whether it exited with 0, the CPU seconds (user and system, all
/// its threads) it used, which `std::process::Child::wait` does not give, and the system's.
fn wait_with_cpu(pid: u32) -> std::io::Result<(bool, f64, f64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data, all zeros a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live locals for the call.
        if unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) } >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, seconds(usage.ru_utime) + seconds(usage.ru_stime), seconds(usage.ru_stime)))
}

/// The table of one model: per mode and link, the median round trip, samples/s, its ratio to
/// the first case's in the same rounds, bytes per sample, CPU per sample and the kernel's share,
/// a step's bytes alone on the link, packets lost, and the scale model's samples/s from those
/// costs ([`super::scale`]). Returns the first case's costs.
fn print_table(name: &str, config: &HostsConfig, cases: &[(Mode, &Link)], runs: &[Vec<HostsRun>], job: &Job) -> Costs {
    println!("\n{name}\n");
    let (mode0, link0) = cases[0];
    println!(
        "| mode | link | round trip (median) | samples/s end to end (median) | vs {mode0} on {link0} (median of rounds) | bytes per sample to / from the servers | CPU per sample, trainers / servers | of it the kernel's | a step's bytes alone on the link, to / from | packets lost | dropped by full queues | model: samples/s (busy: cores, server links) | measured / model |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    let samples = job.samples as f64;
    let mut first = None;
    for ((mode, link), rs) in cases.iter().zip(runs) {
        let per_sample = |f: &dyn Fn(&HostsRun) -> f64| median(rs.iter().map(|r| f(r) / samples).collect());
        let of_runs = |f: &dyn Fn(&HostsRun) -> f64| median(rs.iter().map(f).collect());
        let rate = of_runs(&|r| samples / r.seconds);
        let ratio = median(rs.iter().zip(&runs[0]).map(|(r, base)| base.seconds / r.seconds).collect());
        let (to, from) = (per_sample(&|r| r.bytes_to as f64), per_sample(&|r| r.bytes_from as f64));
        let (tcpu, scpu, kcpu) =
            (per_sample(&|r| r.trainer_cpu), per_sample(&|r| r.server_cpu), per_sample(&|r| r.kernel_cpu));
        let lost = of_runs(&|r| r.dropped as f64);
        let full = of_runs(&|r| r.shaper_drops as f64);
        let rtt = of_runs(&|r| r.round_trip.as_secs_f64() * 1e6);
        // A server link carries the payload's share of its rate (a probe's one flow got 12.0
        // MB/s of 100 Mbit/s, 119.7 of 1 Gbit/s); unshaped, it is not a bound.
        let payload = link.bytes_per_second().map_or(f64::INFINITY, |r| PAYLOAD_SHARE * r);
        let way = |i: usize| Way { alone: of_runs(&|r| r.alone[i]), rate: payload };
        let ways = [way(0), way(1)];
        let costs = Costs { trainer_cpu: tcpu, server_cpu: scpu, kernel_cpu: kcpu, to, from };
        first.get_or_insert(costs);
        let shape = Shape {
            servers: config.servers as f64,
            trainers: config.trainers,
            batch: job.batch as f64,
            links: Some(ways),
            shared_cores: Some(cores),
            server_cores: 1.0,
        };
        let model = predict(&costs, &shape);
        println!(
            "| {mode} | {link} | {rtt:.0} us | {rate:.0} | {ratio:.2}x | {to:.0} / {from:.0} | {:.1} / {:.1} us | {:.0}% | {:.1} / {:.1} ms | {lost:.0} | {full:.0} | {:.0} ({:.0}%, {:.0}%) | {:.2} |",
            tcpu * 1e6,
            scpu * 1e6,
            100.0 * kcpu / (tcpu + scpu),
            ways[0].alone * 1e3,
            ways[1].alone * 1e3,
            model.samples_per_second,
            100.0 * model.cores_busy,
            100.0 * model.links_busy,
            rate / model.samples_per_second
        );
    }
    first.expect("--hosts runs one case at least")
}

/// The scale model's samples/s for clusters of machines like this one (its cores each), one
/// per server or trainer, 4 trainers per server, on 10 and 1 Gbit/s Ethernet (TCP's payload
/// share of the rate, no round trips), from `costs`, a case's as measured here.
fn print_projection(costs: &Costs, batch: f64) {
    let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
    println!("\nProjected by the scale model from the first case's costs: a machine of {cores} cores per server or trainer, 4 trainers per server\n");
    println!("| machines (servers + trainers) | 10 GbE: samples/s | busy: server cores, links | 1 GbE: samples/s | busy: server cores, links |");
    println!("|---|---|---|---|---|");
    for machines in [10, 100, 1000] {
        let servers = machines / 5;
        let trainers = machines - servers;
        let cell = |bits_per_second: f64| {
            let rate = bits_per_second / 8.0;
            let links = Some([Way::nominal(rate, costs.to * batch), Way::nominal(rate, costs.from * batch)]);
            let shape =
                Shape { servers: servers as f64, trainers, batch, links, shared_cores: None, server_cores: cores };
            let p = predict(costs, &shape);
            format!("{:.2} M | {:.0}%, {:.0}%", p.samples_per_second / 1e6, 100.0 * p.cores_busy, 100.0 * p.links_busy)
        };
        println!("| {machines} ({servers} + {trainers}) | {} | {} |", cell(10e9), cell(1e9));
    }
}
