//! Hosts that are not loopback: each server and trainer in a network namespace of its own, one
//! address per host on a bridge that lives in a namespace of its own too (so the machine's own
//! namespace gets no device, address or route), every host's link shaped by `tc` tbf in both
//! directions (`../shared/research/scale-and-geo.md` section 1: this kernel has tbf, not netem).
//! The tests create the namespaces and remove them (processes first); where they cannot be
//! made (not root, no iproute2), they skip with a message.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// `n` hosts on one bridge, host `i` (from 1) at `10.77.K.i`, its link shaped to `rate`.
pub struct Hosts {
    prefix: String,
    subnet: u32,
    n: usize,
}

/// Runs `ip` with `args`; its output, or why it failed.
fn ip(args: &[&str]) -> Result<Output, String> {
    let o = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(o)
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

impl Hosts {
    /// Makes the hosts, or says why it cannot (the caller skips).
    pub fn new(n: usize, rate: &str) -> Result<Hosts, String> {
        // Names of this test's own (the process and a count of the hosts it made), so
        // concurrent tests do not meet; each bridge is a network of its own.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let (pid, k) = (std::process::id(), MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let hosts = Hosts { prefix: format!("oar{pid}n{k}"), subnet: 1 + (pid + k) % 250, n };
        let sw = hosts.switch();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 1..=n {
            let (ns, port, addr) = (hosts.ns(i), format!("port{i}"), format!("{}/24", hosts.addr(i)));
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &sw])?;
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            for (space, dev) in [(&ns, "eth0"), (&sw, port.as_str())] {
                let tbf = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb"];
                ip(&[&["netns", "exec", space.as_str()][..], &tbf[..], &["latency", "10ms"][..]].concat())?;
            }
        }
        Ok(hosts)
    }

    fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    /// Host `i`'s namespace.
    pub fn ns(&self, i: usize) -> String {
        format!("{}h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        format!("10.77.{}.{i}", self.subnet)
    }

    /// Bytes host `i`'s link carried into the switch and out of it to the host, as the
    /// switch's port counts them.
    pub fn link_bytes(&self, i: usize) -> (u64, u64) {
        let o = ip(&["-j", "-s", "-n", &self.switch(), "link", "show", &format!("port{i}")]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let stats = &v[0]["stats64"];
        (stats["rx"]["bytes"].as_u64().unwrap(), stats["tx"]["bytes"].as_u64().unwrap())
    }

    /// Runs the nftables `script` in the switch's namespace; why it failed, if it did.
    fn nft(&self, script: &str) -> Result<(), String> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.switch(), "nft", "-f", "-"]);
        let mut child = c.stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("nft: {e}"))?;
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).map_err(|e| e.to_string())?;
        let o = child.wait_with_output().map_err(|e| e.to_string())?;
        o.status.success().then_some(()).ok_or_else(|| format!("nft: {}", String::from_utf8_lossy(&o.stderr).trim()))
    }

    /// Drops every `n`th packet crossing host `i`'s link in the switch, each way (wire-like
    /// loss, deterministic: `numgen inc`; a drop in the sender's own stack would be a local
    /// error TCP requeues, not a loss). `Err`: no nftables here (the caller skips).
    pub fn lose_every(&self, i: usize, n: u32) -> Result<(), String> {
        let rule = |dir: &str| format!("{dir} \"port{i}\" numgen inc mod {n} == 0 counter drop");
        let chain = format!("{}\n{}", rule("iifname"), rule("oifname"));
        self.nft(&format!(
            "table bridge loss{i} {{ chain fw {{ type filter hook forward priority 0; policy accept;\n{chain}\n}}\n}}"
        ))
    }

    /// Cuts host `i`'s link: the switch drops everything it carries, each way, until [`Hosts::mend`].
    pub fn cut(&self, i: usize) {
        let rules = format!("iifname \"port{i}\" counter drop\noifname \"port{i}\" counter drop");
        self.nft(&format!(
            "table bridge cut{i} {{ chain fw {{ type filter hook forward priority -1; policy accept;\n{rules}\n}}\n}}"
        ))
        .expect("the cut");
    }

    /// Mends the cut of host `i`'s link.
    pub fn mend(&self, i: usize) {
        self.nft(&format!("delete table bridge cut{i}")).expect("the mend");
    }

    /// Packets the switch dropped on host `i`'s link, by loss or by a cut not mended yet.
    pub fn dropped(&self, i: usize) -> u64 {
        let mut sum = 0;
        for table in [format!("loss{i}"), format!("cut{i}")] {
            let args = ["netns", "exec", &self.switch(), "nft", "-j", "list", "table", "bridge", &table];
            let Ok(o) = ip(&args) else { continue }; // no such table
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            for item in v["nftables"].as_array().unwrap() {
                for expr in item["rule"]["expr"].as_array().into_iter().flatten() {
                    sum += expr["counter"]["packets"].as_u64().unwrap_or(0);
                }
            }
        }
        sum
    }

    /// `oar args` on host `i`, with exactly the environment `vars` (plus PATH).
    pub fn oar(&self, i: usize, args: &[&str], vars: &[(&str, String)]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i), env!("CARGO_BIN_EXE_oar")]).args(args);
        c.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "warn");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }
}

impl Drop for Hosts {
    /// Stops what still runs in the hosts, then removes them and the bridge.
    fn drop(&mut self) {
        for i in 1..=self.n {
            if let Ok(o) = ip(&["netns", "pids", &self.ns(i)]) {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = ip(&["netns", "del", &self.ns(i)]);
        }
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}

fn finish(child: Child, what: &str) -> String {
    let o = child.wait_with_output().expect("the process ends");
    assert!(o.status.success(), "{what} failed:\n{}", text(&o));
    text(&o)
}

/// A job of 2 servers and 2 trainers in `mode` through Paddle's Fleet variables (and `extra`),
/// on `hosts` (servers on hosts 1-2, trainers on 3-4) or, without, on loopback; each trainer
/// with its own credential. Returns the saved model's folder and the servers' final counters.
fn fleet_job(
    dir: &Path,
    hosts: Option<&Hosts>,
    out: &str,
    mode: &str,
    extra: &[(&'static str, String)],
    lines: u64,
) -> (std::path::PathBuf, Vec<oar::protocol::ServerStats>) {
    let fleet = start_fleet(dir, hosts, out, mode, extra);
    for (t, child) in fleet.trainers.into_iter().enumerate() {
        let out = finish(child, &format!("trainer {t}"));
        assert!(out.contains(&format!("trained {lines} samples")), "{out}");
    }
    (fleet.model, server_stats(fleet.servers))
}

/// A fleet job's processes, running.
struct Fleet {
    servers: Vec<Child>,
    trainers: Vec<Child>,
    model: std::path::PathBuf,
}

/// Starts the job [`fleet_job`] runs.
fn start_fleet(dir: &Path, hosts: Option<&Hosts>, out: &str, mode: &str, extra: &[(&'static str, String)]) -> Fleet {
    let master = dir.join("master.secret");
    if !master.exists() {
        oar::security::auth::Secret::generate().write_new(&master).unwrap();
        for t in 0..2 {
            let cred = dir.join(format!("trainer-{t}.secret"));
            let o = oar(&[
                "secret",
                "--master",
                master.to_str().unwrap(),
                "--trainer",
                &t.to_string(),
                "--out",
                cred.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{}", text(&o));
        }
    }
    let model = dir.join(out);
    let (addr, ports): (Vec<String>, Vec<u16>) = match hosts {
        Some(h) => ((1..=2).map(|i| h.addr(i)).collect(), vec![7164, 7164]),
        None => (vec!["127.0.0.1".into(); 2], vec![free_ports(1), free_ports(1)]),
    };
    let list = format!("{}:{},{}:{}", addr[0], ports[0], addr[1], ports[1]);
    let common: Vec<(&str, String)> = vec![
        ("OAR_TRAIN", dir.join("data/train").display().to_string()),
        ("OAR_HIDDEN", "16".into()),
        ("OAR_BATCH_SIZE", "200".into()),
        ("OAR_TIMEOUT", "60".into()),
        ("OAR_MODE", mode.into()),
        ("PADDLE_PSERVERS_IP_PORT_LIST", list),
        ("PADDLE_TRAINERS_NUM", "2".into()),
    ]
    .into_iter()
    .chain(extra.iter().cloned())
    .collect();
    let start = |host: usize, mut vars: Vec<(&'static str, String)>| match hosts {
        Some(h) => h.oar(host, &["train"], &vars).spawn().expect("ip netns exec oar starts"),
        None => {
            vars.push(("PATH", std::env::var("PATH").unwrap_or_default()));
            let mut c = Command::new(env!("CARGO_BIN_EXE_oar"));
            c.arg("train").env_clear().env("RUST_LOG", "warn").envs(vars);
            c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("oar starts")
        }
    };
    let servers: Vec<Child> = (0..2)
        .map(|s| {
            let mut vars = common.clone();
            vars.extend([
                ("TRAINING_ROLE", "PSERVER".to_string()),
                ("POD_IP", addr[s].clone()),
                ("PADDLE_PORT", ports[s].to_string()),
                ("OAR_OUTPUT", model.display().to_string()),
                ("OAR_SECRET_FILE", master.display().to_string()),
            ]);
            start(1 + s, vars)
        })
        .collect();
    let trainers: Vec<Child> = (0..2)
        .map(|t| {
            let mut vars = common.clone();
            vars.extend([
                ("TRAINING_ROLE", "TRAINER".to_string()),
                ("PADDLE_TRAINER_ID", t.to_string()),
                ("OAR_SECRET_FILE", dir.join(format!("trainer-{t}.secret")).display().to_string()),
            ]);
            start(3 + t, vars)
        })
        .collect();
    Fleet { servers, trainers, model }
}

/// The final counters of the servers, which must end well.
fn server_stats(servers: Vec<Child>) -> Vec<oar::protocol::ServerStats> {
    let stats = servers.into_iter().enumerate().map(|(s, child)| {
        let out = finish(child, &format!("server {s}"));
        let line = out.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).expect("the server's counters");
        serde_json::from_str(line).expect("the counters parse")
    });
    stats.collect()
}

/// Four hosts on 1 Gbit/s links, or `None` (said on stderr) where namespaces cannot be made.
fn four_hosts() -> Option<Hosts> {
    Hosts::new(4, "1gbit").map_err(|why| eprintln!("skipped: no network namespaces here ({why})")).ok()
}

#[test]
fn a_sync_job_across_hosts_on_shaped_links_trains_the_model_it_trains_on_loopback() {
    let Some(hosts) = four_hosts() else { return };
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 2, 1500, 10);
    let (across, _) = fleet_job(dir.path(), Some(&hosts), "across", "sync", &[], 1500);
    // Counted at the switch: every host's link carried the job's traffic both ways (about 1 MB
    // each way here: the dense blocks and rows of every step), none of it on loopback.
    for i in 1..=4 {
        let (up, down) = hosts.link_bytes(i);
        eprintln!("host {i}: {up} bytes up, {down} down");
        assert!(up > 500_000 && down > 500_000, "host {i}'s link carried {up} bytes up and {down} down");
    }
    let (local, _) = fleet_job(dir.path(), None, "loopback", "sync", &[], 1500);
    // Sync training is deterministic: the hosts and the link change nothing in the model.
    assert_same_params(&load_params(&across.join("final")), &load_params(&local.join("final")), 0.0);
}

/// GEO across hosts, against async on the same links and data (60 steps per trainer): counted
/// at the switch, the servers' links carry fewer bytes with exchanges every 20 steps (after 1,
/// 2, 4, 8 at the start), and the frames the servers count themselves are what their links
/// carried, less TCP's and IP's own bytes (and the handshakes, which they do not count). The
/// saving is small here (about 0.7x: a 16-unit model, and ids mostly seen once, which GEO pulls
/// and pushes once as async does); on the CTR-DNN's 1.7 MB of dense blocks it is 14x (Modes).
#[test]
fn a_geo_job_across_hosts_sends_fewer_bytes_than_async_counted_at_the_switch_and_by_the_servers() {
    let Some(hosts) = four_hosts() else { return };
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 2, 12_000, 10);
    let mut carried = Vec::new();
    for mode in ["async", "geo"] {
        let before: Vec<(u64, u64)> = (1..=2).map(|i| hosts.link_bytes(i)).collect();
        let extra = [("OAR_GEO_K_STEPS", "20".to_string()), ("OAR_SYNC_WARMUP", "0".to_string())];
        let (_, stats) = fleet_job(dir.path(), Some(&hosts), mode, mode, &extra, 12_000);
        let mut link = 0;
        for (s, st) in stats.iter().enumerate() {
            let (up, down) = hosts.link_bytes(s + 1);
            let on_link = (up - before[s].0) + (down - before[s].1);
            let frames = st.frame_bytes_in + st.frame_bytes_out;
            eprintln!("{mode}: server {s}: {frames} frame bytes, {on_link} bytes on its link");
            assert!(
                frames <= on_link && on_link < 2 * frames,
                "{mode}: server {s} counted {frames} frame bytes, its link carried {on_link}"
            );
            let took: Vec<u64> = st.applied_samples.iter().zip(&st.discarded_samples).map(|(a, d)| a + d).collect();
            assert_eq!(took, vec![12_000, 12_000], "{mode}: server {s} took every sample once");
            link += on_link;
        }
        carried.push(link);
    }
    assert!(carried[1] < carried[0], "geo's servers' links carried {} bytes, async's {}", carried[1], carried[0]);
}

/// Streams the standard error of each of `children` (trainer `t` is `children[t]`) into one
/// channel as (t, line), and keeps each whole for the end.
fn watch_stderr(children: &mut [Child]) -> (mpsc::Receiver<(usize, String)>, Vec<thread::JoinHandle<String>>) {
    let (tx, rx) = mpsc::channel();
    let threads = children.iter_mut().enumerate().map(|(t, child)| {
        let (tx, err) = (tx.clone(), child.stderr.take().expect("piped"));
        thread::spawn(move || {
            let mut whole = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send((t, line.clone()));
                whole.push_str(&line);
                whole.push('\n');
            }
            whole
        })
    });
    (rx, threads.collect())
}

/// Waits until host `i`'s link has carried `bytes` both ways together (the job is under way).
fn wait_for_traffic(hosts: &Hosts, i: usize, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while {
        let (up, down) = hosts.link_bytes(i);
        up + down < bytes
    } {
        assert!(Instant::now() < deadline, "host {i}'s link did not carry {bytes} bytes within 120 s");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (up to 120 s) for a line of `lines` that holds `what`; returns the trainer that wrote it.
fn wait_for_line(lines: &mpsc::Receiver<(usize, String)>, what: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok((t, line)) if line.contains(what) => return t,
            Ok(_) => {}
            Err(e) => panic!("no trainer wrote {what:?} within 120 s ({e})"),
        }
    }
}

/// Four hosts whose switch runs nftables, or `None` (said on stderr).
fn four_hosts_with_nft() -> Option<Hosts> {
    let hosts = four_hosts()?;
    match hosts.nft("list ruleset") {
        Ok(()) => Some(hosts),
        Err(why) => {
            eprintln!("skipped: no nftables here ({why})");
            None
        }
    }
}

/// One packet in 200 lost on every host's link, dropped in the switch both ways (a wire's loss,
/// which TCP retransmits): sync training across the hosts still trains the loopback model bit
/// for bit, and every server applied every trainer's samples once.
#[test]
fn a_sync_job_over_lossy_links_trains_the_loopback_model_with_every_sample_applied_once() {
    let Some(hosts) = four_hosts_with_nft() else { return };
    (1..=4).for_each(|i| hosts.lose_every(i, 200).expect("the loss rules"));
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 2, 3000, 10);
    let (across, stats) = fleet_job(dir.path(), Some(&hosts), "lossy", "sync", &[], 3000);
    let dropped: Vec<u64> = (1..=4).map(|i| hosts.dropped(i)).collect();
    eprintln!("packets dropped on the hosts' links: {dropped:?}");
    assert!(dropped.iter().all(|&d| d > 0), "every link lost packets: {dropped:?}");
    for (s, st) in stats.iter().enumerate() {
        assert_eq!(st.applied_samples, vec![3000, 3000], "server {s} applied every sample once");
    }
    let (local, _) = fleet_job(dir.path(), None, "loopback", "sync", &[], 3000);
    assert_same_params(&load_params(&across.join("final")), &load_params(&local.join("final")), 0.0);
}

/// A server's link cut mid-job for longer than the reply timeout (33 s): a trainer with a
/// recovery window says which server it lost and at which address, reconnects once the link is
/// back, sends the unanswered request again, and the job ends with every sample applied once
/// at every server (counted by the servers).
#[test]
fn a_cut_server_link_that_comes_back_loses_no_sample_and_applies_none_twice() {
    let Some(hosts) = four_hosts_with_nft() else { return };
    let dir = tempfile::tempdir().unwrap();
    let lines = 20_000;
    gen_data(&dir.path().join("data"), 2, lines, 10);
    // Async from the first step: a cut during the synchronous warm-up is a trainer missing
    // from a sync step, which the servers' own wait of `--timeout` names instead.
    let extra = [
        ("OAR_TIMEOUT", "3".to_string()),
        ("OAR_RECOVER_TIMEOUT", "120".to_string()),
        ("OAR_SYNC_WARMUP", "0".to_string()),
    ];
    let mut fleet = start_fleet(dir.path(), Some(&hosts), "cut", "async", &extra);
    let (stderr, threads) = watch_stderr(&mut fleet.trainers);
    wait_for_traffic(&hosts, 2, 1_000_000);
    hosts.cut(2);
    let t = wait_for_line(&stderr, &format!("lost server 1 (server 1 at {}:7164", hosts.addr(2)));
    eprintln!("trainer {t} lost server 1 after {} dropped packets", hosts.dropped(2));
    hosts.mend(2);
    let mut back = 0;
    for (t, (child, err)) in fleet.trainers.into_iter().zip(threads).enumerate() {
        let o = child.wait_with_output().unwrap();
        let err = err.join().unwrap();
        assert!(o.status.success(), "trainer {t} failed:\n{err}");
        back += err.contains("server 1 is back") as usize;
        assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("trained {lines} samples")), "{err}");
    }
    assert!(back > 0, "a trainer said server 1 was back");
    for (s, st) in server_stats(fleet.servers).iter().enumerate() {
        let took: Vec<u64> = st.applied_samples.iter().zip(&st.discarded_samples).map(|(a, d)| a + d).collect();
        assert_eq!(took, vec![lines, lines], "server {s} took every sample once");
    }
}

/// A cut that lasts, with no recovery window (the default): each trainer fails within its
/// reply timeout (`--timeout` plus 30 s, so that a server's own waits of `--timeout`, which
/// name whom it waits for, answer first) with one line naming the server and its address.
#[test]
fn a_cut_server_link_that_lasts_fails_the_trainers_naming_the_server_and_its_address() {
    let Some(hosts) = four_hosts_with_nft() else { return };
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 2, 20_000, 10);
    let extra = [("OAR_TIMEOUT", "3".to_string()), ("OAR_SYNC_WARMUP", "0".to_string())];
    let mut fleet = start_fleet(dir.path(), Some(&hosts), "cut", "async", &extra);
    wait_for_traffic(&hosts, 2, 1_000_000);
    hosts.cut(2);
    let started = Instant::now();
    for (t, child) in fleet.trainers.drain(..).enumerate() {
        let o = child.wait_with_output().unwrap();
        let err = text(&o);
        assert!(!o.status.success(), "trainer {t} ended well with its server cut off:\n{err}");
        let named = format!("server 1 at {}:7164", hosts.addr(2));
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        eprintln!("trainer {t}: {last}");
        assert!(last.contains(&named), "trainer {t}'s last line names {named}: {last}");
    }
    eprintln!("the trainers failed {:.1} s after the cut", started.elapsed().as_secs_f64());
}
