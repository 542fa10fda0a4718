//! What a step's bytes take on the links, measured rather than read off their rate: each way
//! between a trainer's host and the servers', alone on rested links. The scale model
//! ([`super::scale`]) takes it from here: tbf lets the first 256 KB of a rested link's transfer
//! through at once, and round trips, TCP's headers, acknowledgements, slow start and a
//! shaper's drops take their share, all of which a transfer shows and no formula of the rate
//! does.
//!
//! The probe moves bytes as a trainer's step does: from the trainer's host over a connection to
//! each server's host (through the server's [`DelayLine`] when the link has one), a step's
//! bytes spread evenly over them at once, each part a request answered by the other side. So a
//! transfer's time holds its round trip, as a pull or a push does, and what the servers' parts
//! cost each other where they meet: on the trainer's link, and in its shaper's queue when they
//! all answer at once.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::delay::{listen_in, DelayLine};
use super::netns::enter_netns;

/// Each probe's transfers: each way, this many times (medians).
const REPEATS: usize = 3;

/// The two ways of a transfer, as the probe's request names them.
const TO_SERVER: u8 = 0;
const FROM_SERVER: u8 = 1;

/// Where the probe finds one server: the namespace its sink runs in (`None`: this process's
/// own), the address the sink listens on, and where a delay line in front of it listens.
pub struct Sink {
    /// The server's namespace.
    pub ns: Option<String>,
    /// Where the sink listens.
    pub at: SocketAddr,
    /// Where the sink's delay line listens, when the link has a delay.
    pub line: Option<SocketAddr>,
}

/// Measures both ways between a trainer in namespace `trainer_ns` and a sink it starts for each
/// of `sinks`, through their delay lines of `delay` when one is given: `bytes` each way (to the
/// servers, from them) spread over the sinks, 3 times, after `rest` each so that the
/// shapers' buckets fill again as they do while a trainer computes. Returns, per way, the
/// median seconds.
pub fn measure(
    trainer_ns: Option<&str>,
    sinks: &[Sink],
    delay: Option<Duration>,
    bytes: [u64; 2],
    rest: Duration,
) -> io::Result<[f64; 2]> {
    let mut servers = Vec::new();
    let mut lines = Vec::new();
    let mut targets = Vec::new();
    for sink in sinks {
        let (at, server) = listen_in(sink.ns.as_deref(), sink.at, "transfer-sink", |l| -> io::Result<()> {
            let (mut s, _) = l.accept()?;
            s.set_nodelay(true)?;
            serve(&mut s)
        })?;
        servers.push(server);
        match (delay, sink.line) {
            (Some(d), Some(line_at)) => {
                let line = DelayLine::start(sink.ns.as_deref(), line_at, at, d)?;
                targets.push(line.addr());
                lines.push(line);
            }
            _ => targets.push(at),
        }
    }
    let parts = targets.len().max(1) as u64;
    let trainer_ns = trainer_ns.map(str::to_string);
    let probe = std::thread::spawn(move || -> io::Result<[Vec<f64>; 2]> {
        trainer_ns.as_deref().map_or(Ok(()), enter_netns)?;
        let mut streams = Vec::new();
        for target in targets {
            let s = TcpStream::connect(target)?;
            s.set_nodelay(true)?;
            streams.push(s);
        }
        let mut times: [Vec<f64>; 2] = Default::default();
        for _ in 0..REPEATS {
            for (way, &n) in bytes.iter().enumerate() {
                std::thread::sleep(rest);
                times[way].push(spread(&mut streams, way as u8, n / parts)?);
            }
        }
        Ok(times)
    });
    let times = probe.join().map_err(|_| io::Error::other("the transfer probe panicked"))??;
    drop(lines);
    for server in servers {
        server.join().map_err(|_| io::Error::other("the transfer sink panicked"))?.transpose()?;
    }
    Ok(times.map(super::median))
}

/// One transfer of `n` bytes on each of `streams` at once, the way `way` names; its seconds,
/// until the last of them ends.
fn spread(streams: &mut [TcpStream], way: u8, n: u64) -> io::Result<f64> {
    let started = Instant::now();
    std::thread::scope(|scope| {
        let parts: Vec<_> = streams.iter_mut().map(|s| scope.spawn(move || transfer(s, way, n))).collect();
        parts.into_iter().try_for_each(|p| p.join().map_err(|_| io::Error::other("a transfer panicked"))?)
    })?;
    Ok(started.elapsed().as_secs_f64())
}

/// One transfer of `n` bytes on `s` the way `way` names, from the request to the last byte (to
/// the server: its one-byte answer).
fn transfer(s: &mut TcpStream, way: u8, n: u64) -> io::Result<()> {
    let mut request = [0u8; 9];
    request[0] = way;
    request[1..].copy_from_slice(&n.to_le_bytes());
    s.write_all(&request)?;
    if way == TO_SERVER {
        send(s, n)?;
        s.read_exact(&mut [0u8; 1])?;
    } else {
        receive(s, n)?;
    }
    Ok(())
}

/// The sink: answers each request until the probe closes its connection.
fn serve(s: &mut TcpStream) -> io::Result<()> {
    let mut request = [0u8; 9];
    loop {
        match s.read_exact(&mut request) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let n = u64::from_le_bytes(request[1..].try_into().expect("8 bytes"));
        match request[0] {
            TO_SERVER => {
                receive(s, n)?;
                s.write_all(&[1])?;
            }
            FROM_SERVER => send(s, n)?,
            other => return Err(io::Error::other(format!("a transfer probe asked for way {other}"))),
        }
    }
}

/// Writes `n` bytes of zeros.
fn send(s: &mut TcpStream, n: u64) -> io::Result<()> {
    let chunk = [0u8; 64 << 10];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k])?;
        left -= k as u64;
    }
    Ok(())
}

/// Reads exactly `n` bytes.
fn receive(s: &mut TcpStream, n: u64) -> io::Result<()> {
    let got = io::copy(&mut Read::by_ref(s).take(n), &mut io::sink())?;
    if got < n {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("a transfer ended after {got} of {n} bytes")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback, no namespace, two sinks: both ways move their bytes, and a delay line adds its
    /// round trip to every transfer.
    #[test]
    fn a_probe_times_both_ways_over_every_sink_and_a_delay_adds_to_each() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let sinks = || [0, 1].map(|_| Sink { ns: None, at: any, line: Some(any) });
        let direct = measure(None, &sinks(), None, [1 << 20, 1 << 19], Duration::ZERO).unwrap();
        assert!(direct.iter().all(|&t| t > 0.0), "{direct:?}");
        let delay = Duration::from_millis(5);
        let delayed = measure(None, &sinks(), Some(delay), [1 << 10, 1 << 10], Duration::ZERO).unwrap();
        assert!(delayed.iter().all(|&t| t >= 2.0 * delay.as_secs_f64()), "{delayed:?} through a {delay:?} line");
    }

    #[test]
    fn a_sink_refuses_a_way_it_does_not_know() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let sink = std::thread::spawn(move || serve(&mut listener.accept().unwrap().0));
        let mut s = TcpStream::connect(at).unwrap();
        s.write_all(&[9, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let err = sink.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("way 9"), "{err}");
    }
}
