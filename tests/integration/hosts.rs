//! Hosts that are not loopback (`oar::bench::netns`): each server and trainer in a network
//! namespace of its own, its link shaped, lossy or cut. The tests create the namespaces and
//! remove them (processes first); where they cannot be made (not root, no iproute2, no
//! nftables), they skip with a message.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;
use oar::bench::netns::{Hosts, Link};

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
        Some(h) => h
            .command(host, Path::new(env!("CARGO_BIN_EXE_oar")), &["train"], &vars)
            .spawn()
            .expect("ip netns exec oar starts"),
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

/// Samples server `st` took from each trainer: applied, or discarded as a duplicate.
fn took(st: &oar::protocol::ServerStats) -> Vec<u64> {
    st.applied_samples.iter().zip(&st.discarded_samples).map(|(a, d)| a + d).collect()
}

/// A link below 1 Gbit/s carries wire-sized packets (one TCP segment each), as a switch port
/// sees frames, so its shapers drop single frames; a faster one keeps the kernel's GSO packets,
/// which cost the cores less: both ends of each host's link say so.
#[test]
fn a_slow_link_carries_wire_sized_packets_and_a_fast_one_gso_packets() {
    for (rate, wire) in [("100mbit", true), ("1gbit", false)] {
        let link = Link::rate(rate);
        assert_eq!(link.wire_sized(), wire, "{rate}");
        let hosts = match Hosts::new(2, &link) {
            Ok(hosts) => hosts,
            Err(why) => return eprintln!("skipped: no network namespaces here ({why})"),
        };
        for i in 1..=2 {
            let segs = hosts.gso_max_segs(i).unwrap();
            assert!(segs.iter().all(|&s| (s == 1) == wire), "{rate}: host {i}'s link: {segs:?} segments a packet");
        }
    }
}

/// Four hosts on 1 Gbit/s links, or `None` (said on stderr) where namespaces cannot be made.
fn four_hosts() -> Option<Hosts> {
    Hosts::new(4, &Link::rate("1gbit")).map_err(|why| eprintln!("skipped: no network namespaces here ({why})")).ok()
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
        let (up, down) = hosts.link_bytes(i).unwrap();
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
        let before: Vec<(u64, u64)> = (1..=2).map(|i| hosts.link_bytes(i).unwrap()).collect();
        let extra = [("OAR_GEO_K_STEPS", "20".to_string()), ("OAR_SYNC_WARMUP", "0".to_string())];
        let (_, stats) = fleet_job(dir.path(), Some(&hosts), mode, mode, &extra, 12_000);
        let mut link = 0;
        for (s, st) in stats.iter().enumerate() {
            let (up, down) = hosts.link_bytes(s + 1).unwrap();
            let on_link = (up - before[s].0) + (down - before[s].1);
            let frames = st.frame_bytes_in + st.frame_bytes_out;
            eprintln!("{mode}: server {s}: {frames} frame bytes, {on_link} bytes on its link");
            assert!(
                frames <= on_link && on_link < 2 * frames,
                "{mode}: server {s} counted {frames} frame bytes, its link carried {on_link}"
            );
            assert_eq!(took(st), vec![12_000, 12_000], "{mode}: server {s} took every sample once");
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
        let (up, down) = hosts.link_bytes(i).unwrap();
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
    let dropped: Vec<u64> = (1..=4).map(|i| hosts.dropped(i).unwrap()).collect();
    eprintln!("packets dropped on the hosts' links: {dropped:?}");
    assert!(dropped.iter().all(|&d| d > 0), "every link lost packets: {dropped:?}");
    for (s, st) in stats.iter().enumerate() {
        assert_eq!(st.applied_samples, vec![3000, 3000], "server {s} applied every sample once");
    }
    let (local, _) = fleet_job(dir.path(), None, "loopback", "sync", &[], 3000);
    assert_same_params(&load_params(&across.join("final")), &load_params(&local.join("final")), 0.0);
}

/// A server's link cut mid-job for longer than the reply timeout (33 s), with a recovery window
/// given to every process: a trainer says which server it lost and at which address, reconnects
/// once the link is back, sends the unanswered request again, and the job ends with every sample
/// applied once at every server (counted by the servers). The servers wait the same window for
/// trainers their keepalive gave up on, should the link come back after it (about 60 s):
/// `robustness::a_server_role_of_oar_train_waits_the_jobs_recovery_window_for_a_lost_trainer`.
#[test]
fn a_cut_server_link_that_comes_back_loses_no_sample_and_applies_none_twice() {
    let Some(hosts) = four_hosts_with_nft() else { return };
    let dir = tempfile::tempdir().unwrap();
    let lines = 20_000;
    gen_data(&dir.path().join("data"), 2, lines, 10);
    // Async from the first step: a cut during the synchronous warm-up is a trainer missing
    // from a sync step, which the servers' own wait of `--timeout` names instead. One
    // environment for every process, as a user gives it: `--timeout` 3 s makes the trainers'
    // reply timeout 33 s, and a trainer that comes back later than the other finds it asking
    // again at the pass's barrier (refused after the servers' 3 s) within its window.
    let extra = [
        ("OAR_TIMEOUT", "3".to_string()),
        ("OAR_RECOVER_TIMEOUT", "120".to_string()),
        ("OAR_SYNC_WARMUP", "0".to_string()),
    ];
    let mut fleet = start_fleet(dir.path(), Some(&hosts), "cut", "async", &extra);
    let (stderr, threads) = watch_stderr(&mut fleet.trainers);
    let (_, server_threads) = watch_stderr(&mut fleet.servers);
    wait_for_traffic(&hosts, 2, 1_000_000);
    hosts.cut(2).unwrap();
    let t = wait_for_line(&stderr, &format!("lost server 1 (server 1 at {}:7164", hosts.addr(2)));
    eprintln!("trainer {t} lost server 1 after {} dropped packets", hosts.dropped(2).unwrap());
    hosts.mend(2).unwrap();
    let ended: Vec<(Output, String)> = fleet
        .trainers
        .into_iter()
        .zip(threads)
        .map(|(child, err)| (child.wait_with_output().unwrap(), err.join().unwrap()))
        .collect();
    if ended.iter().any(|(o, _)| !o.status.success()) {
        // The servers would wait out their window for the failed trainer: stop them now.
        fleet.servers.iter_mut().for_each(|c| drop(c.kill()));
    }
    let outputs: Vec<Output> = fleet.servers.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let server_err: Vec<String> = server_threads.into_iter().map(|t| t.join().unwrap()).collect();
    let failed = ended.iter().any(|(o, _)| !o.status.success()) || outputs.iter().any(|o| !o.status.success());
    // Every process's account when one fails: a trainer's failure may start at a server.
    let all = || {
        let trainers = ended.iter().enumerate().map(|(t, (_, err))| format!("trainer {t}:\n{err}"));
        let servers = server_err.iter().enumerate().map(|(s, err)| format!("server {s}:\n{err}"));
        trainers.chain(servers).collect::<Vec<_>>().join("\n")
    };
    assert!(!failed, "a process failed:\n{}", all());
    let back = ended.iter().filter(|(_, err)| err.contains("server 1 is back")).count();
    assert!(back > 0, "no trainer said server 1 was back:\n{}", all());
    for (o, err) in &ended {
        assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("trained {lines} samples")), "{err}");
    }
    for (s, o) in outputs.iter().enumerate() {
        let line = text(o).lines().find_map(|l| l.strip_prefix("OAR_RESULT ").map(str::to_string));
        let st: oar::protocol::ServerStats = serde_json::from_str(&line.expect("the server's counters")).unwrap();
        assert_eq!(took(&st), vec![lines, lines], "server {s} took every sample once");
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
    hosts.cut(2).unwrap();
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

/// `oar bench --hosts`, short: 1 server and 3 trainers, both models, async and GEO, on an
/// unshaped link and a lossy, delayed 1 Gbit/s one: a table each with a round trip, a rate,
/// the servers' bytes, the processes' CPU per sample, the packets the switch dropped (some on
/// the lossy link, none on the other) and the scale model's rate; the delayed link's round
/// trips take at least twice its delay, through the delay lines in the servers' hosts. (GEO's
/// bytes are checked across hosts above: 1,000 samples a trainer are too few exchanges.)
#[test]
fn oar_bench_hosts_prints_the_shaped_link_table_of_both_models() {
    if four_hosts_with_nft().is_none() {
        return;
    }
    let slow = "1gbit+loss200+delay2ms";
    let links = format!("unshaped,{slow}");
    let args = [
        "--lines",
        "3000",
        "--runs",
        "1",
        "--links",
        &links,
        "--modes",
        "async,geo",
        "--servers",
        "1",
        "--trainers",
        "3",
    ];
    let o = oar(&[&["bench", "--hosts"][..], &args[..]].concat());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("| async |") || l.starts_with("| geo |"))
        .map(|l| l.split('|').map(str::trim).filter(|c| !c.is_empty()).collect())
        .collect();
    assert_eq!(rows.len(), 8, "a row per mode, link and model:\n{out}");
    for row in &rows {
        let round_trip: f64 = row[2].trim_end_matches(" us").parse().unwrap();
        let rate: f64 = row[3].parse().unwrap();
        let bytes: f64 = row[5].split(" / ").map(|b| b.parse::<f64>().unwrap()).sum();
        let cpu: Vec<f64> = row[6].trim_end_matches(" us").split(" / ").map(|c| c.parse().unwrap()).collect();
        let kernel: f64 = row[7].trim_end_matches('%').parse().unwrap();
        let alone: Vec<f64> = row[8].trim_end_matches(" ms").split(" / ").map(|c| c.parse().unwrap()).collect();
        let lost: f64 = row[9].parse().unwrap();
        assert!(cpu[0] > 0.0 && cpu[1] > 0.0, "{row:?}: trainers and servers used CPU");
        assert!(kernel > 0.0 && kernel < 100.0, "{row:?}: the kernel's share of the CPU");
        assert!(rate > 0.0 && bytes > 100.0, "{row:?}");
        assert_eq!(lost > 0.0, row[1] == slow, "{row:?}");
        assert!(row[1] != slow || round_trip >= 4000.0, "{row:?}: round trips under twice the delay");
        // A step's bytes through the delay line wait its round trip (4 ms) at least.
        assert!(alone.iter().all(|&a| a > 0.0 && (row[1] != slow || a >= 4.0)), "{row:?}: a step's bytes alone");
        let (model, busy) = row[11].split_once(' ').unwrap();
        assert!(model.parse::<f64>().unwrap() > 0.0 && busy.starts_with('('), "{row:?}: the scale model's rate");
        assert!(row[12].parse::<f64>().unwrap() > 0.0, "{row:?}: measured / model");
    }
    // Each round's line gives the share of TCP's segments sent again, counted in the hosts'
    // namespaces: some on the lossy link, where every lost packet is sent again.
    let rounds: Vec<&str> = out.lines().filter(|l| l.contains(", round 1: ")).collect();
    assert_eq!(rounds.len(), 8, "{out}");
    for line in rounds {
        let before = line.split("% of TCP's segments sent again").next().unwrap();
        let share: f64 = before.rsplit(", ").next().unwrap().parse().unwrap();
        assert!((0.0..=100.0).contains(&share) && (share > 0.0 || !line.contains(slow)), "{line}");
    }
    // Each model's costs projected to clusters: 10, 100 and 1,000 machines, a rate each.
    let projected: Vec<&str> =
        out.lines().filter(|l| l.starts_with("| 10 (2 + 8) |") || l.starts_with("| 1000 (200 + 800) |")).collect();
    assert_eq!(projected.len(), 4, "{out}");
    for row in projected {
        let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
        let rate = |c: &str| c.trim_end_matches(" M").parse::<f64>().unwrap();
        assert!(rate(cells[1]) > 0.0 && rate(cells[3]) > 0.0, "{row}");
    }
}

/// An sshd on each of hosts 2 and 3 (their own addresses, port 22; keys and configuration in
/// `dir`), and the client configuration that reaches them; `None` (said on stderr) where sshd
/// cannot run. The daemons live in the hosts' namespaces and go with them.
fn sshd_on_hosts(hosts: &Hosts, dir: &Path) -> Option<()> {
    let missing: Vec<_> = ["/usr/sbin/sshd", "ssh", "ssh-keygen"].into_iter().filter(|p| !installed(p)).collect();
    if !missing.is_empty() || std::fs::create_dir_all("/run/sshd").is_err() {
        eprintln!("skipped: no sshd here ({missing:?} missing or /run/sshd not writable)");
        return None;
    }
    for key in ["hostkey", "clientkey"] {
        let ok = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(dir.join(key)).status();
        assert!(ok.unwrap().success(), "ssh-keygen failed");
    }
    std::fs::copy(dir.join("clientkey.pub"), dir.join("authorized_keys")).unwrap();
    let d = dir.display();
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
    let client = format!(
        "Host 10.77.*\n  User {}\n  IdentityFile {d}/clientkey\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  \
         UserKnownHostsFile {d}/known_hosts\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 5\n",
        user.trim()
    );
    std::fs::write(dir.join("ssh_config"), client).unwrap();
    for i in 2..=3 {
        let config = dir.join(format!("sshd_{i}"));
        let server = format!(
            "ListenAddress {}:22\nHostKey {d}/hostkey\nPidFile {d}/sshd_{i}.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             StrictModes no\n",
            hosts.addr(i)
        );
        std::fs::write(&config, server).unwrap();
        let log = dir.join(format!("sshd_{i}.log"));
        let mut c = Command::new("ip");
        // A daemon of its own: sshd forks into the background of host i's namespace.
        c.args(["netns", "exec", &hosts.ns(i), "/usr/sbin/sshd", "-f"]).arg(&config).arg("-E").arg(log);
        assert!(c.stdin(Stdio::null()).status().unwrap().success(), "sshd on host {i} started");
    }
    // Ready when host 1 logs into both (each login retried until the deadline).
    for i in 2..=3 {
        wait_until(30, &format!("sshd on host {i}"), || {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &hosts.ns(1), "ssh", "-F"])
                .arg(dir.join("ssh_config"))
                .args([&hosts.addr(i), "true"]);
            c.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
        });
    }
    Some(())
}

/// `oar cluster ssh` from host 1 over ssh to hosts 2 and 3, across the switch: a server and a
/// trainer on each, listening on and reaching each other's own addresses, train to a saved
/// model; the job's traffic crossed hosts 2's and 3's links.
#[test]
fn cluster_ssh_from_one_host_runs_the_job_on_two_others_across_the_switch() {
    let Some(hosts) = four_hosts() else { return };
    let dir = tempfile::tempdir().unwrap();
    if sshd_on_hosts(&hosts, dir.path()).is_none() {
        return;
    }
    let ws = dir.path().join("ws");
    gen_data(&ws.join("data"), 2, 3000, 100);
    std::fs::write(dir.path().join("hosts"), format!("{}\n{}\n", hosts.addr(2), hosts.addr(3))).unwrap();
    let before: Vec<(u64, u64)> = (2..=3).map(|i| hosts.link_bytes(i).unwrap()).collect();
    let (p, rws) = (|p: &Path| p.display().to_string(), dir.path().join("remote-ws"));
    let args = [
        "cluster",
        "ssh",
        "--no-progress",
        "--dispatch",
        "--port",
        "7164",
        "--hosts",
        &p(&dir.path().join("hosts")),
        "--ssh-config",
        &p(&dir.path().join("ssh_config")),
        "--workspace",
        &p(&ws),
        "--remote-workspace",
        &p(&rws),
        "--",
        "--mode",
        "async",
        "--hidden",
        "16",
        "--batch-size",
        "200",
        "--train",
        "data/train",
        "--test",
        "data/test",
        "--output",
        "model",
    ];
    let o = hosts.command(1, Path::new(env!("CARGO_BIN_EXE_oar")), &args, &[]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("oar cluster ssh on 2 hosts: 2 servers x 2 workers, 6000 samples"), "{stdout}");
    for (s, i) in [(0, 2), (1, 3)] {
        let log = std::fs::read_to_string(rws.join(format!("log/server.{s}.log"))).unwrap();
        assert!(log.contains(&format!("OAR_READY {}:7164", hosts.addr(i))), "server {s}:\n{log}");
        let (up, down) = hosts.link_bytes(i).unwrap();
        let carried = (up - before[s].0) + (down - before[s].1);
        assert!(carried > 500_000, "host {i}'s link carried {carried} bytes");
    }
    assert!(rws.join("model/final/manifest.json").exists(), "the saved model");
}
