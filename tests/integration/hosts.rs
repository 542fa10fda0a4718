//! Hosts that are not loopback: each server and trainer in a network namespace of its own, one
//! address per host on a bridge that lives in a namespace of its own too (so the machine's own
//! namespace gets no device, address or route), every host's link shaped by `tc` tbf in both
//! directions (`../shared/research/scale-and-geo.md` section 1: this kernel has tbf, not netem).
//! The tests create the namespaces and remove them (processes first); where they cannot be
//! made (not root, no iproute2), they skip with a message.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

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
        // Names and a subnet of this test process's own, so concurrent tests do not meet.
        let pid = std::process::id();
        let hosts = Hosts { prefix: format!("oar{pid}"), subnet: 1 + pid % 250, n };
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
    for (t, child) in trainers.into_iter().enumerate() {
        let out = finish(child, &format!("trainer {t}"));
        assert!(out.contains(&format!("trained {lines} samples")), "{out}");
    }
    let stats = servers
        .into_iter()
        .enumerate()
        .map(|(s, child)| {
            let out = finish(child, &format!("server {s}"));
            let line = out.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).expect("the server's counters");
            serde_json::from_str(line).expect("the counters parse")
        })
        .collect();
    (model, stats)
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
