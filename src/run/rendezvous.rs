//! One rendezvous for every cluster engine. An engine (mpirun, srun, ...) tells a process only
//! its rank and the world size (`OMPI_COMM_WORLD_*`, `PMI_*`, `SLURM_*`); ranks `0..S-1` become
//! servers and the rest trainers. Rank 0 listens on the rendezvous address; every process (rank 0
//! included) registers its own server address there (the local address of its connection to rank
//! 0, so the interface that routes there), and once all `size` ranks are present each receives
//! the full layout. A wait that times out names the ranks that never registered.
//!
//! The protocol is one JSON line each way over TCP: `{"rank":r,"size":n,"addr":"host:port"}`
//! in, `{"servers":["host:port",...]}` (by server index) or `{"error":"..."}` out. With the
//! job's secret, the registration is preceded by the challenge and response of
//! [`crate::security::auth`] as JSON lines: `{"nonce":hex}` in, `{"nonce":hex,"proof":hex}` out,
//! `{"proof":hex}` in; a caller that cannot prove the secret is refused before its
//! registration is read, and a rank never takes a layout from a host that cannot prove it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::security::auth::Identity;

/// What a rank's proof to the rendezvous is for: its identity in job `job` (the master for a
/// server rank, a trainer's credential or the master for a trainer rank), made to the
/// rendezvous (not a parameter server: a proof relayed between the two fails).
fn ranks(job: &str, identity: Identity) -> crate::security::auth::Claim<'_> {
    crate::security::auth::Claim { job, identity, server: crate::security::auth::RENDEZVOUS, epoch: 0 }
}

/// Why a rank that proved `identity` may not register as `rank` of a job whose ranks
/// `0..servers` are servers, if it may not: a trainer's credential registers its own rank only,
/// a tool's or an operator's none; the master any.
fn refusal(identity: Identity, rank: usize, servers: usize) -> Option<String> {
    match identity {
        Identity::Master => None,
        Identity::Trainer(t) if (t as usize).checked_add(servers) == Some(rank) => None,
        Identity::Trainer(t) => Some(format!(
            "rank {rank} proved trainer {t}'s credential, which is rank {}'s",
            (t as usize).saturating_add(servers)
        )),
        other => Some(format!("rank {rank} proved {}, which is no rank of a job", other.label())),
    }
}

/// This process's place as its engine gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    /// 0-based rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// The variables it came from.
    pub source: &'static str,
}

/// Reads the rank and world size of Open MPI (`OMPI_COMM_WORLD_RANK/SIZE`), MPICH/PMI
/// (`PMI_RANK/PMI_SIZE`) or Slurm (`SLURM_PROCID/SLURM_NTASKS`), first found first.
pub fn rank_from(get: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Option<Rank>> {
    for (rank_var, size_var, source) in [
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
        ("PMI_RANK", "PMI_SIZE", "PMI"),
        ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
    ] {
        let (Some(r), Some(s)) = (get(rank_var), get(size_var)) else { continue };
        let rank: usize =
            r.trim().parse().with_context(|| format!("environment variable {rank_var}: {r:?} is not a rank"))?;
        let size: usize =
            s.trim().parse().with_context(|| format!("environment variable {size_var}: {s:?} is not a size"))?;
        anyhow::ensure!(
            rank < size,
            "environment variables {rank_var}={rank} and {size_var}={size}: the rank must be below the size"
        );
        return Ok(Some(Rank { rank, size, source }));
    }
    Ok(None)
}

#[derive(Serialize, Deserialize)]
struct Register {
    rank: usize,
    size: usize,
    addr: String,
}

/// One line of the challenge and response (fields by step).
#[derive(Serialize, Deserialize, Default)]
struct AuthLine {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nonce: Option<String>,
    /// The identity a caller proves (its first line; none: the master).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    proof: Option<String>,
}

fn write_line<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).expect("rendezvous lines serialize");
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one line of at most 64 KiB: a caller that streams bytes cannot hold the host.
fn read_line<R: BufRead>(r: &mut R) -> Option<String> {
    let mut line = String::new();
    r.take(64 << 10).read_line(&mut line).ok().filter(|n| *n > 0)?;
    Some(line)
}

#[derive(Serialize, Deserialize)]
struct Layout {
    #[serde(default)]
    servers: Vec<String>,
    #[serde(default)]
    error: Option<String>,
}

/// The longest one caller may take to send its registration (a rank sends it at once).
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);
/// The most callers whose registrations are read at once; more are closed unread.
const READING_AT_ONCE: usize = 256;

/// Rank 0's side: accepts the registrations of all `size` ranks on `listener` (its own
/// included, made by [`register`] like everyone's), then sends everyone the server list.
/// Ranks `0..servers` are servers. Returns the list.
///
/// Each caller is read on its own thread, within 5 s: read one after another,
/// a few callers that sent nothing (or a byte every few seconds) held the host past everyone's
/// timeout, even with a secret, since they were read before they could be refused.
pub fn host(
    listener: TcpListener,
    size: usize,
    servers: usize,
    timeout: Duration,
    secret: Option<crate::security::auth::Secret>,
    job: &str,
) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    let mut joined: Vec<Option<(TcpStream, String)>> = (0..size).map(|_| None).collect();
    let (registered, registrations) = std::sync::mpsc::channel();
    let reading = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while joined.iter().any(Option::is_none) {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (0..size).filter(|&r| joined[r].is_none()).collect();
            let message = format!("rendezvous timed out after {timeout:?} waiting for rank(s) {missing:?} of {size}");
            for (stream, _) in joined.iter_mut().flatten() {
                let _ = write_line(stream, &Layout { servers: vec![], error: Some(message.clone()) });
            }
            anyhow::bail!(message);
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                use std::sync::atomic::Ordering::SeqCst;
                if reading.fetch_add(1, SeqCst) >= READING_AT_ONCE {
                    reading.fetch_sub(1, SeqCst);
                    tracing::warn!(%peer, "closed a connection to the rendezvous: {READING_AT_ONCE} are being read");
                    continue;
                }
                let (registered, reading, secret) = (registered.clone(), reading.clone(), secret.clone());
                let job = job.to_string();
                std::thread::spawn(move || {
                    let until = deadline.min(Instant::now() + REGISTRATION_WAIT);
                    let read = read_registration(stream, until, secret.as_ref(), &job);
                    reading.fetch_sub(1, SeqCst);
                    match read {
                        Some(r) => {
                            let _ = registered.send(r);
                        }
                        // One bad caller (a port scanner, a stray client, a rank that died
                        // mid-line) must not fail everyone's rendezvous: answered, logged, skipped.
                        None => {
                            tracing::warn!(%peer, "ignored a connection to the rendezvous that sent no registration")
                        }
                    }
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok((mut stream, r, identity)) = registrations.recv_timeout(Duration::from_millis(10)) {
                    let r: Register = r;
                    if r.size != size || r.rank >= size || joined[r.rank].is_some() {
                        let error = format!(
                            "rank {} of {} does not fit this job of {size} ranks (or registered twice)",
                            r.rank, r.size
                        );
                        let _ = write_line(&mut stream, &Layout { servers: vec![], error: Some(error) });
                        continue;
                    }
                    if let Some(error) = refusal(identity, r.rank, servers) {
                        tracing::warn!("refused a registration at the rendezvous: {error}");
                        let _ = write_line(&mut stream, &Layout { servers: vec![], error: Some(error) });
                        continue;
                    }
                    joined[r.rank] = Some((stream, r.addr));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    let list: Vec<String> = joined[..servers].iter().flatten().map(|(_, a)| a.clone()).collect();
    for (stream, _) in joined.iter_mut().flatten() {
        write_line(stream, &Layout { servers: list.clone(), error: None })?;
    }
    Ok(list)
}

/// A stream read until `until` at the latest, however the bytes are spread: each read waits
/// only for what is left of the time.
struct Until {
    stream: TcpStream,
    until: Instant,
}

impl Read for Until {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Reads one registration line (after the challenge and response with a secret), all of it
/// by `until`, with the identity the caller proved (the master without a secret); a malformed
/// one is answered with an error. `None`: nothing usable came.
fn read_registration(
    stream: TcpStream,
    until: Instant,
    secret: Option<&crate::security::auth::Secret>,
    job: &str,
) -> Option<(TcpStream, Register, Identity)> {
    stream.set_nonblocking(false).ok()?;
    let mut reader = BufReader::new(Until { stream: stream.try_clone().ok()?, until });
    let mut stream = stream;
    let mut identity = Identity::Master;
    if let Some(secret) = secret {
        let refuse = |stream: &mut TcpStream| {
            let error = "authentication failed: this rendezvous takes only the job's ranks".to_string();
            let _ = write_line(stream, &Layout { servers: vec![], error: Some(error) });
        };
        let hello: Option<AuthLine> = read_line(&mut reader).and_then(|l| serde_json::from_str(&l).ok());
        let Some((theirs, claimed)) = hello.and_then(|h| {
            let claimed = match &h.identity {
                Some(label) => Identity::parse(label)?,
                None => Identity::Master,
            };
            Some((crate::security::auth::from_hex(&h.nonce?)?, claimed))
        }) else {
            refuse(&mut stream);
            return None;
        };
        identity = claimed;
        let claim = ranks(job, identity);
        let ours = crate::security::auth::nonce();
        let Some(proof) = secret.server_proof(&claim, &theirs, &ours) else {
            refuse(&mut stream);
            return None;
        };
        let proof = crate::security::auth::to_hex(&proof);
        let line = AuthLine { nonce: Some(crate::security::auth::to_hex(&ours)), proof: Some(proof), identity: None };
        write_line(&mut stream, &line).ok()?;
        let answer: Option<AuthLine> = read_line(&mut reader).and_then(|l| serde_json::from_str(&l).ok());
        let proved = answer.and_then(|a| crate::security::auth::from_hex(&a.proof?));
        if !proved.is_some_and(|p| secret.is_client_proof(&claim, &ours, &theirs, &p)) {
            refuse(&mut stream);
            return None;
        }
    }
    let line = read_line(&mut reader).unwrap_or_default();
    match serde_json::from_str(&line) {
        Ok(r) => Some((stream, r, identity)),
        Err(e) => {
            let error = format!("a malformed rendezvous registration: {e}");
            let _ = write_line(&mut stream, &Layout { servers: vec![], error: Some(error) });
            None
        }
    }
}

/// Registers `rank` (with its server address, or "" for a trainer) at `rendezvous` and waits
/// for the server list. `addr` may be a function of the address this process reaches the
/// rendezvous from (so servers advertise the interface that routes to the others).
pub fn register(
    rendezvous: &str,
    rank: Rank,
    addr: &dyn Fn(std::net::IpAddr) -> String,
    timeout: Duration,
    secret: Option<&crate::security::auth::Secret>,
    job: &str,
) -> anyhow::Result<Vec<String>> {
    if let Some(theirs) = secret.and_then(|s| s.job()).filter(|j| *j != job) {
        anyhow::bail!("rank {}: its credential is for job {theirs:?}, not {job:?}", rank.rank);
    }
    let deadline = Instant::now() + timeout;
    let stream = loop {
        let attempt = rendezvous
            .to_socket_addrs()
            .with_context(|| format!("rendezvous address {rendezvous}"))?
            .next()
            .with_context(|| format!("rendezvous address {rendezvous} resolves to nothing"))
            .and_then(|sa| TcpStream::connect_timeout(&sa, Duration::from_secs(2)).map_err(anyhow::Error::from));
        match attempt {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!(
                    "rank {}: the rendezvous at {rendezvous} (rank 0) was not reachable within {timeout:?}: {e}",
                    rank.rank
                )
            }
            // Rank 0 may not be listening yet.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let own = addr(stream.local_addr()?.ip());
    let mut writer = stream.try_clone()?;
    stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1))))?;
    let mut reader = BufReader::new(&stream);
    if let Some(secret) = secret {
        let ours = crate::security::auth::nonce();
        let claim = ranks(job, secret.identity());
        let identity = (!secret.is_master()).then(|| secret.identity().label());
        write_line(
            &mut writer,
            &AuthLine { nonce: Some(crate::security::auth::to_hex(&ours)), proof: None, identity },
        )?;
        let line = read_line(&mut reader).unwrap_or_default();
        let challenge: AuthLine = serde_json::from_str(&line).unwrap_or_default();
        let layout: Option<Layout> = serde_json::from_str(&line).ok();
        if let Some(e) = layout.and_then(|l| l.error) {
            anyhow::bail!("rendezvous at {rendezvous}: {e}");
        }
        let theirs = challenge.nonce.as_deref().and_then(crate::security::auth::from_hex);
        let proof = challenge.proof.as_deref().and_then(crate::security::auth::from_hex);
        let (Some(theirs), Some(proof)) = (theirs, proof) else {
            anyhow::bail!("rank {}: the rendezvous at {rendezvous} did not answer the challenge", rank.rank)
        };
        anyhow::ensure!(
            secret.is_server_proof(&claim, &ours, &theirs, &proof),
            "rank {}: the rendezvous at {rendezvous} did not prove it holds the job's secret",
            rank.rank
        );
        let proof = secret
            .client_proof(&claim, &theirs, &ours)
            .with_context(|| format!("rank {}: its credential is for another job than {job:?}", rank.rank))?;
        let proof = crate::security::auth::to_hex(&proof);
        write_line(&mut writer, &AuthLine { nonce: None, proof: Some(proof), identity: None })?;
    }
    write_line(&mut writer, &Register { rank: rank.rank, size: rank.size, addr: own })?;
    let reply = read_line(&mut reader)
        .with_context(|| format!("rank {}: no layout from the rendezvous at {rendezvous}", rank.rank))?;
    let layout: Layout =
        serde_json::from_str(&reply).with_context(|| format!("rank {}: a malformed layout", rank.rank))?;
    if let Some(e) = layout.error {
        anyhow::bail!("rendezvous at {rendezvous}: {e}");
    }
    Ok(layout.servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_mpi_pmi_or_slurm() {
        let get = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let r = rank_from(&get(&[("PMI_RANK", "2"), ("PMI_SIZE", "4")])).unwrap().unwrap();
        assert_eq!((r.rank, r.size, r.source), (2, 4, "PMI"));
        let r = rank_from(&get(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")])).unwrap().unwrap();
        assert_eq!((r.rank, r.size), (0, 3));
        assert!(rank_from(&get(&[])).unwrap().is_none());
        let e = rank_from(&get(&[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("below the size"), "{e}");
    }

    #[test]
    fn everyone_gets_the_servers_in_rank_order_and_a_missing_rank_is_named() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let hosting = std::thread::spawn(move || host(listener, 3, 2, Duration::from_secs(10), None, "j"));
        let joins: Vec<_> = (0..3)
            .map(|r| {
                let at = at.clone();
                std::thread::spawn(move || {
                    let me = Rank { rank: r, size: 3, source: "test" };
                    register(
                        &at,
                        me,
                        &|ip| if r < 2 { format!("{ip}:{}", 7000 + r) } else { String::new() },
                        Duration::from_secs(10),
                        None,
                        "j",
                    )
                })
            })
            .collect();
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap(), ["127.0.0.1:7000", "127.0.0.1:7001"]);
        }
        assert_eq!(hosting.join().unwrap().unwrap().len(), 2);

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let hosting = std::thread::spawn(move || host(listener, 3, 1, Duration::from_millis(500), None, "j"));
        let me = Rank { rank: 0, size: 3, source: "test" };
        let err =
            register(&at, me, &|ip| format!("{ip}:1"), Duration::from_secs(5), None, "j").unwrap_err().to_string();
        assert!(err.contains("waiting for rank(s) [1, 2] of 3"), "{err}");
        assert!(hosting.join().unwrap().is_err());
    }

    /// Garbage, an early hang-up and a rank of another job reach the host before the real
    /// ranks: each is answered or dropped, and the real ranks still get their layout.
    #[test]
    fn bad_registrations_do_not_abort_the_rendezvous() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let hosting = std::thread::spawn(move || host(listener, 2, 1, Duration::from_secs(20), None, "j"));
        let reply = |line: &[u8]| {
            let mut s = TcpStream::connect(&at).unwrap();
            s.write_all(line).unwrap();
            let mut reply = String::new();
            BufReader::new(s).read_line(&mut reply).unwrap();
            reply
        };
        assert!(reply(b"GET / HTTP/1.0\r\n\r\n").contains("malformed rendezvous registration"));
        drop(TcpStream::connect(&at).unwrap());
        assert!(reply(b"{\"rank\":5,\"size\":9,\"addr\":\"\"}\n").contains("does not fit this job"));
        let joins: Vec<_> = (0..2)
            .map(|r| {
                let at = at.clone();
                std::thread::spawn(move || {
                    let me = Rank { rank: r, size: 2, source: "test" };
                    register(&at, me, &|ip| format!("{ip}:7000"), Duration::from_secs(20), None, "j")
                })
            })
            .collect();
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap(), ["127.0.0.1:7000"]);
        }
        assert!(hosting.join().unwrap().is_ok());
    }

    /// Callers that send nothing, or a byte at a time without end, are read apart from the
    /// ranks and each dropped after its own wait: twelve idle ones held a host for 12 x 5 s,
    /// past the ranks' 20 s, and a dribbling one for ever; now the ranks meet at once.
    #[test]
    fn silent_and_dribbling_callers_cannot_hold_the_rendezvous() {
        let secret = crate::security::auth::Secret::generate();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let held = secret.clone();
        let hosting = std::thread::spawn(move || host(listener, 2, 1, Duration::from_secs(20), Some(held), "j"));
        let idle: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(&at).unwrap()).collect();
        // A byte of a line every 100 ms, until the host hangs up (its writes then fail).
        let dribbler = {
            let at = at.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&at).unwrap();
                let mut sent = 0;
                while s.write_all(b"{").is_ok() && sent < 1000 {
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                sent
            })
        };
        let joins: Vec<_> = (0..2)
            .map(|r| {
                let (at, secret) = (at.clone(), secret.clone());
                let me = Rank { rank: r, size: 2, source: "test" };
                std::thread::spawn(move || {
                    register(&at, me, &|ip| format!("{ip}:7000"), Duration::from_secs(20), Some(&secret), "j")
                })
            })
            .collect();
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap(), ["127.0.0.1:7000"]);
        }
        assert!(hosting.join().unwrap().is_ok());
        // The dribbler was cut off after its wait (5 s: about 50 bytes), not read for ever.
        assert!(dribbler.join().unwrap() < 1000, "the dribbling caller was never cut off");
        drop(idle);
    }

    /// With the job's secret, a registration without it (plain, or proved with another secret)
    /// is refused before it is read, a rank never takes a layout from a host with another
    /// secret, and the job's ranks meet as before.
    #[test]
    fn with_a_secret_only_the_jobs_ranks_register() {
        let secret = crate::security::auth::Secret::generate();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let held = secret.clone();
        let hosting = std::thread::spawn(move || host(listener, 2, 1, Duration::from_secs(20), Some(held), "j"));
        let mut plain = TcpStream::connect(&at).unwrap();
        plain.write_all(b"{\"rank\":0,\"size\":2,\"addr\":\"10.9.9.9:1\"}\n").unwrap();
        let mut reply = String::new();
        BufReader::new(plain).read_line(&mut reply).unwrap();
        assert!(reply.contains("authentication failed") && !reply.contains("servers\":[\""), "{reply}");
        let me = |r| Rank { rank: r, size: 2, source: "test" };
        let other = crate::security::auth::Secret::generate();
        let err =
            register(&at, me(0), &|_| "10.9.9.9:1".into(), Duration::from_secs(5), Some(&other), "j").unwrap_err();
        assert!(err.to_string().contains("did not prove it holds the job's secret"), "{err}");
        let joins: Vec<_> = (0..2)
            .map(|r| {
                let (at, secret) = (at.clone(), secret.clone());
                std::thread::spawn(move || {
                    register(&at, me(r), &|ip| format!("{ip}:7000"), Duration::from_secs(20), Some(&secret), "j")
                })
            })
            .collect();
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap(), ["127.0.0.1:7000"], "the forged rank 0 took no place");
        }
        assert!(hosting.join().unwrap().is_ok());
    }

    /// Per-rank credentials: a trainer rank proves its own credential (the host, holding the
    /// master, derives its key) and registers its own rank only; a trainer's credential for
    /// another rank, a tool's, or one of another job is refused, and the job's ranks meet.
    #[test]
    fn a_trainer_rank_registers_with_its_own_credential_and_as_its_own_rank_only() {
        let master = crate::security::auth::Secret::generate();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let held = master.clone();
        // Ranks 0 and 1 serve; rank 2 is trainer 0, rank 3 trainer 1.
        let hosting = std::thread::spawn(move || host(listener, 4, 2, Duration::from_secs(20), Some(held), "j"));
        let me = |r| Rank { rank: r, size: 4, source: "test" };
        let own = |t| master.derive("j", Identity::Trainer(t)).unwrap();
        let quick = Duration::from_secs(5);
        let register_as = |r, secret: &crate::security::auth::Secret| {
            register(&at, me(r), &|_| String::new(), quick, Some(secret), "j")
        };
        let e = register_as(3, &own(0)).unwrap_err().to_string();
        assert!(e.contains("rank 3 proved trainer 0's credential, which is rank 2's"), "{e}");
        let e = register_as(3, &master.derive("j", Identity::Tool).unwrap()).unwrap_err().to_string();
        assert!(e.contains("rank 3 proved tool, which is no rank"), "{e}");
        let e = register_as(3, &master.derive("another", Identity::Trainer(1)).unwrap()).unwrap_err().to_string();
        assert!(e.contains("its credential is for job \"another\", not \"j\""), "{e}");
        let joins: Vec<_> = (0..4)
            .map(|r| {
                let (at, secret) = (at.clone(), if r < 2 { master.clone() } else { own(r as u64 - 2) });
                std::thread::spawn(move || {
                    register(
                        &at,
                        me(r),
                        &|ip| format!("{ip}:{}", 7000 + r),
                        Duration::from_secs(20),
                        Some(&secret),
                        "j",
                    )
                })
            })
            .collect();
        for j in joins {
            assert_eq!(j.join().unwrap().unwrap(), ["127.0.0.1:7000", "127.0.0.1:7001"]);
        }
        assert!(hosting.join().unwrap().is_ok());
    }
}
