//! Hosts that are not loopback, on one machine: each host a network namespace of its own with
//! one address on a bridge that lives in a namespace of its own too (so the machine's own
//! namespace gets no device, address or route), every host's link shaped by `tc` tbf in both
//! directions, and loss and cuts made by nftables in the switch
//! (`../shared/research/scale-and-geo.md` section 1: this kernel has tbf, not netem). Used by
//! `oar bench --hosts` and the hosts tests; it needs root, iproute2 and, for loss and cuts,
//! nftables, and says why when it cannot make the hosts.

use std::process::{Command, Output, Stdio};

/// A host link's shape, written `RATE[+lossN][+delayD]`: `RATE` is tc's (`100mbit`, `1gbit`,
/// `10gbit`) or `unshaped` (the veth's own speed, bound by the CPU), `+lossN` drops every Nth
/// packet each way (`+loss1000`: 0.1%), and `+delayD` (`+delay500us`, `+delay1ms`) is a one-way
/// delay between trainers and servers, each way, which [`super::delay::DelayLine`]s add in the
/// servers' hosts (this kernel cannot delay packets on a link).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// tc's rate; `None`: unshaped.
    pub rate: Option<String>,
    /// Every this many packets one is lost, each way (0: none).
    pub lose_every: u32,
    /// The one-way delay in microseconds; `None`: no delay line (`Some(0)`: a line that only
    /// forwards, to measure what the line itself costs).
    pub delay_us: Option<u64>,
}

impl Link {
    /// A link of `rate` (tc's spelling), without loss or delay.
    pub fn rate(rate: &str) -> Link {
        Link { rate: Some(rate.into()), lose_every: 0, delay_us: None }
    }

    /// tbf's bucket: 256 KB, 1 MB from 10 Gbit/s (a smaller one gave 9.43 Gbit/s and slower
    /// large requests there, the brief's measurement).
    fn burst(&self) -> &'static str {
        if self.bytes_per_second().is_some_and(|b| b >= 10e9 / 8.0) {
            "1mb"
        } else {
            "256kb"
        }
    }

    /// Whether the link carries wire-sized packets: below 1 Gbit/s its devices send one TCP
    /// segment a packet. A veth hands tbf whole GSO packets of up to 44 segments (64 KB), and
    /// tbf drops such a packet whole, where a switch drops single frames: at 100 Mbit/s, with
    /// four servers' replies meeting on one trainer's link, those whole-packet drops cost
    /// 4 x 4 CTR-DNN runs about a third of their samples/s (the scale model's one miss,
    /// measured / model 0.69-0.75; 1.12 with wire-sized packets). Below 1 Gbit/s a link
    /// carries at most about 8,300 frames a second each way, which the cores forward at a
    /// small cost; at 1 Gbit/s wire-sized packets cut a 4 x 4 run from 29,774 to 17,323
    /// samples/s in the cores' time, where the shapers had dropped 2 packets, so faster links
    /// keep their GSO packets (`docs/src/measurements/2026-12-01-scale-model.md`).
    pub fn wire_sized(&self) -> bool {
        self.bytes_per_second().is_some_and(|b| b < 1e9 / 8.0)
    }

    /// The rate in bytes/s each way; `None`: unshaped.
    pub fn bytes_per_second(&self) -> Option<f64> {
        self.rate.as_deref().and_then(rate_bytes)
    }
}

/// A tc rate (`100mbit`, `1gbit`, `2.5gbit`, `500kbit`) in bytes/s.
fn rate_bytes(rate: &str) -> Option<f64> {
    let (number, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)]
        .into_iter()
        .find_map(|(unit, scale)| rate.strip_suffix(unit).map(|n| (n, scale)))?;
    number.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0).map(|v| v * scale / 8.0)
}

impl std::str::FromStr for Link {
    type Err = String;

    fn from_str(s: &str) -> Result<Link, String> {
        let mut parts = s.split('+');
        let rate = parts.next().unwrap_or_default();
        let (mut lose_every, mut delay_us) = (0, None);
        for part in parts {
            if let Some(n) = part.strip_prefix("loss").filter(|_| lose_every == 0) {
                lose_every = match n.parse::<u32>() {
                    Ok(n) if n >= 2 => n,
                    _ => return Err(format!("link {s:?}: lossN loses one packet in N (N at least 2)")),
                };
            } else if let Some(d) = part.strip_prefix("delay").filter(|_| delay_us.is_none()) {
                delay_us = Some(micros(d).ok_or_else(|| {
                    format!("link {s:?}: delayD is a one-way delay of at most 1s, in us or ms (delay500us, delay1ms)")
                })?);
            } else {
                return Err(format!("link {s:?}: after '+' comes lossN or delayD, once each"));
            }
        }
        let rate = match rate {
            "unshaped" => None,
            _ if rate_bytes(rate).is_some() => Some(rate.to_string()),
            _ => return Err(format!("link {s:?}: the rate is unshaped or a number with kbit, mbit or gbit (1gbit)")),
        };
        Ok(Link { rate, lose_every, delay_us })
    }
}

/// Microseconds in `d`, a whole number with `us` or `ms` (`0.5ms` too), up to a second.
fn micros(d: &str) -> Option<u64> {
    let (number, scale) = match d.strip_suffix("us") {
        Some(n) => (n, 1.0),
        None => (d.strip_suffix("ms")?, 1000.0),
    };
    let v = number.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)? * scale;
    (v.fract() == 0.0 && v <= 1e6).then_some(v as u64)
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.rate.as_deref().unwrap_or("unshaped"))?;
        if self.lose_every > 0 {
            write!(f, "+loss{}", self.lose_every)?;
        }
        match self.delay_us {
            Some(us) if us > 0 && us % 1000 == 0 => write!(f, "+delay{}ms", us / 1000),
            Some(us) => write!(f, "+delay{us}us"),
            None => Ok(()),
        }
    }
}

/// Moves the calling thread (only it: `setns` moves the caller, and threads it starts later
/// inherit its namespace) into the network namespace `ip netns` named `name`.
pub fn enter_netns(name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: the descriptor is open for the call; CLONE_NEWNET asks for a network namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `n` hosts on one bridge, host `i` (from 1) at `10.77.K.i`, each link shaped as a [`Link`].
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
    /// Makes the hosts, each link shaped as `link` says, or says why it cannot (the caller
    /// skips).
    pub fn new(n: usize, link: &Link) -> Result<Hosts, String> {
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
            for (space, dev) in hosts.ends(i) {
                if let Some(rate) = &link.rate {
                    let tbf =
                        ["tc", "qdisc", "replace", "dev", &dev, "root", "tbf", "rate", rate, "burst", link.burst()];
                    ip(&[&["netns", "exec", space.as_str()][..], &tbf[..], &["latency", "10ms"][..]].concat())?;
                }
                if link.wire_sized() {
                    ip(&["-n", &space, "link", "set", "dev", &dev, "gso_max_segs", "1"])?;
                }
            }
            if link.lose_every > 0 {
                hosts.lose_every(i, link.lose_every)?;
            }
        }
        Ok(hosts)
    }

    /// The two ends of host `i`'s link, (namespace, device): the host's own device and the
    /// switch's port.
    fn ends(&self, i: usize) -> [(String, String); 2] {
        [(self.ns(i), "eth0".to_string()), (self.switch(), format!("port{i}"))]
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
    pub fn link_bytes(&self, i: usize) -> Result<(u64, u64), String> {
        let o = ip(&["-j", "-s", "-n", &self.switch(), "link", "show", &format!("port{i}")])?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("ip -j link show: {e}"))?;
        let stats = &v[0]["stats64"];
        let count =
            |dir: &str| stats[dir]["bytes"].as_u64().ok_or_else(|| format!("ip -j link show port{i}: no {dir} bytes"));
        Ok((count("rx")?, count("tx")?))
    }

    /// Runs the nftables `script` in the switch's namespace; why it failed, if it did.
    pub fn nft(&self, script: &str) -> Result<(), String> {
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
    pub fn cut(&self, i: usize) -> Result<(), String> {
        let rules = format!("iifname \"port{i}\" counter drop\noifname \"port{i}\" counter drop");
        self.nft(&format!(
            "table bridge cut{i} {{ chain fw {{ type filter hook forward priority -1; policy accept;\n{rules}\n}}\n}}"
        ))
    }

    /// Mends the cut of host `i`'s link.
    pub fn mend(&self, i: usize) -> Result<(), String> {
        self.nft(&format!("delete table bridge cut{i}"))
    }

    /// Packets the switch dropped on host `i`'s link, by loss or by a cut not mended yet.
    pub fn dropped(&self, i: usize) -> Result<u64, String> {
        let mut sum = 0;
        for table in [format!("loss{i}"), format!("cut{i}")] {
            let args = ["netns", "exec", &self.switch(), "nft", "-j", "list", "table", "bridge", &table];
            let Ok(o) = ip(&args) else { continue }; // no such table
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).map_err(|e| format!("nft -j list table bridge {table}: {e}"))?;
            let items = v["nftables"].as_array().ok_or_else(|| format!("nft -j list table bridge {table}: no list"))?;
            for item in items {
                for expr in item["rule"]["expr"].as_array().into_iter().flatten() {
                    sum += expr["counter"]["packets"].as_u64().unwrap_or(0);
                }
            }
        }
        Ok(sum)
    }

    /// Packets the shapers of host `i`'s link dropped, both ways: tbf drops what overflows its
    /// queue (10 ms of the rate beyond its bucket), as a switch drops what overflows its
    /// buffer; TCP sends them again.
    pub fn shaper_drops(&self, i: usize) -> Result<u64, String> {
        let mut sum = 0;
        for (space, dev) in self.ends(i) {
            let o = ip(&["netns", "exec", &space, "tc", "-j", "-s", "qdisc", "show", "dev", &dev])?;
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).map_err(|e| format!("tc -j -s qdisc show dev {dev}: {e}"))?;
            let qdiscs = v.as_array().ok_or_else(|| format!("tc -j -s qdisc show dev {dev}: no list"))?;
            sum += qdiscs.iter().map(|q| q["drops"].as_u64().unwrap_or(0)).sum::<u64>();
        }
        Ok(sum)
    }

    /// The most TCP segments one packet may carry on host `i`'s link, at its two ends (the
    /// host's device, the switch's port): 1 on a link of wire-sized packets
    /// ([`Link::wire_sized`]), the kernel's GSO limit (65,535) on a faster one. A shaper's
    /// packet counts say nothing of it: tc counts a GSO packet as its segments, and drops it
    /// whole.
    pub fn gso_max_segs(&self, i: usize) -> Result<[u64; 2], String> {
        let mut segs = [0; 2];
        for (k, (space, dev)) in self.ends(i).iter().enumerate() {
            let o = ip(&["-d", "-j", "-n", space, "link", "show", "dev", dev])?;
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).map_err(|e| format!("ip -d -j link show dev {dev}: {e}"))?;
            segs[k] = v[0]["gso_max_segs"]
                .as_u64()
                .ok_or_else(|| format!("ip -d -j link show dev {dev}: no gso_max_segs"))?;
        }
        Ok(segs)
    }

    /// What host `i`'s TCP has counted so far in its namespace (`/proc/net/netstat` and
    /// `/proc/net/snmp`).
    pub fn tcp_counts(&self, i: usize) -> Result<TcpCounts, String> {
        let o = ip(&["netns", "exec", &self.ns(i), "cat", "/proc/net/netstat", "/proc/net/snmp"])?;
        let text = String::from_utf8_lossy(&o.stdout);
        let field = |group: &str, name: &str| {
            netstat_field(&text, group, name)
                .ok_or_else(|| format!("host {i}: no {group} {name} in /proc/net/netstat or /proc/net/snmp"))
        };
        Ok(TcpCounts {
            timeouts: field("TcpExt", "TCPTimeouts")?,
            sent: field("Tcp", "OutSegs")?,
            resent: field("Tcp", "RetransSegs")?,
        })
    }

    /// `exe args` on host `i`, with exactly the environment `vars` (plus PATH).
    pub fn command(&self, i: usize, exe: &std::path::Path, args: &[&str], vars: &[(&str, String)]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i)]).arg(exe).args(args);
        c.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "warn");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }
}

/// Counts of a host's TCP, or their growth over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpCounts {
    /// Retransmission timeouts (`TcpExt: TCPTimeouts`): each stalls a connection for 200 ms or
    /// more, where a loss found by fast retransmit costs a round trip.
    pub timeouts: u64,
    /// Segments sent (`Tcp: OutSegs`).
    pub sent: u64,
    /// Segments sent again (`Tcp: RetransSegs`): bytes the links carry that no frame counter
    /// of oar's sees.
    pub resent: u64,
}

impl TcpCounts {
    /// The sum of `self` and `other`.
    pub fn plus(self, other: TcpCounts) -> TcpCounts {
        TcpCounts {
            timeouts: self.timeouts + other.timeouts,
            sent: self.sent + other.sent,
            resent: self.resent + other.resent,
        }
    }

    /// What was counted since `before`.
    pub fn since(self, before: TcpCounts) -> TcpCounts {
        TcpCounts {
            timeouts: self.timeouts.saturating_sub(before.timeouts),
            sent: self.sent.saturating_sub(before.sent),
            resent: self.resent.saturating_sub(before.resent),
        }
    }
}

/// Field `name` of group `group` in `/proc/net/netstat`'s or `/proc/net/snmp`'s text, which
/// give each group as a line of names and a line of values (`Tcp:` is not `TcpExt:`).
fn netstat_field(text: &str, group: &str, name: &str) -> Option<u64> {
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let at = names.split_whitespace().position(|n| n == name);
        if let Some(v) = at.and_then(|k| values.split_whitespace().nth(k)) {
            return v.parse().ok();
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::{netstat_field, rate_bytes, Link};

    #[test]
    fn links_parse_rates_and_loss_and_print_back() {
        for s in
            ["unshaped", "1gbit", "10gbit+loss1000", "100mbit", "2.5gbit+loss2", "1gbit+delay1ms", "unshaped+delay0us"]
        {
            assert_eq!(s.parse::<Link>().unwrap().to_string(), s);
        }
        let lossy = Link { rate: Some("1gbit".into()), lose_every: 1000, delay_us: Some(500) };
        for s in ["1gbit+loss1000+delay500us", "1gbit+delay0.5ms+loss1000"] {
            assert_eq!(s.parse::<Link>().unwrap(), lossy);
        }
        assert_eq!("10gbit".parse::<Link>().unwrap().burst(), "1mb");
        assert_eq!("1gbit".parse::<Link>().unwrap().burst(), "256kb");
        let wire_sized = |s: &str| s.parse::<Link>().unwrap().wire_sized();
        assert!(wire_sized("100mbit") && wire_sized("500kbit+loss1000") && wire_sized("999mbit"));
        assert!(!wire_sized("1gbit") && !wire_sized("10gbit") && !wire_sized("unshaped"));
        for bad in [
            "",
            "fast",
            "1gb",
            "0gbit",
            "gbit",
            "1gbit+",
            "1gbit+loss1",
            "1gbit+loss",
            "1gbit+drop5",
            "-1mbit",
            "1gbit+delay1",
            "1gbit+delay-1ms",
            "1gbit+delay2s",
            "1gbit+delay0.5us",
            "1gbit+delay1ms+delay1ms",
            "1gbit+loss5+loss5",
            "1gbit+delayNaNms",
            "1gbit+delay2000ms",
        ] {
            assert!(bad.parse::<Link>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn rates_read_as_tc_writes_them() {
        assert_eq!(rate_bytes("100mbit"), Some(12.5e6));
        assert_eq!(rate_bytes("2.5gbit"), Some(312.5e6));
        for bad in ["", "gbit", "1gb", "-1gbit", "NaNmbit", "infgbit"] {
            assert_eq!(rate_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_netstat_field_is_read_by_its_name_in_its_group() {
        let text =
            "TcpExt: SyncookiesSent TCPTimeouts Other\nTcpExt: 0 17 3\nIpExt: InNoRoutes TCPTimeouts\nIpExt: 5 9\n";
        assert_eq!(netstat_field(text, "TcpExt", "TCPTimeouts"), Some(17));
        assert_eq!(netstat_field(text, "IpExt", "TCPTimeouts"), Some(9));
        assert_eq!(netstat_field(text, "TcpExt", "Missing"), None);
        assert_eq!(netstat_field("TcpExt: TCPTimeouts\n", "TcpExt", "TCPTimeouts"), None, "no values line");
        // /proc/net/snmp after /proc/net/netstat: `Tcp:` is its own group.
        let both = format!("{text}Tcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 1000 42\n");
        assert_eq!(netstat_field(&both, "Tcp", "RetransSegs"), Some(42));
        assert_eq!(netstat_field(&both, "Tcp", "TCPTimeouts"), None, "TcpExt's field is not Tcp's");
        assert_eq!(netstat_field(&both, "TcpExt", "TCPTimeouts"), Some(17));
    }
}
