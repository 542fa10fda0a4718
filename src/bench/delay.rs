//! A delay line for TCP connections. This kernel cannot hold a packet back (no netem, fq or
//! ETF: `../shared/research/scale-and-geo.md` section 1), so latency is added where the bytes
//! are: a [`DelayLine`] listens in the server's host, beside the server, and forwards every
//! connection to it, passing each chunk of bytes on only once it is `delay` old, each way. A
//! trainer that reaches a server through it sees round trips longer by twice the delay, while
//! the link's rate, loss and cuts still apply (the line sits behind the link). It also measures
//! round trips ([`round_trip`]), so that what a delay did is shown, not assumed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::netns::enter_netns;

/// Chunks in flight each way before the reader waits (a 64 KB chunk each: 4 MB, more than a
/// 10 Gbit/s link carries in 2 ms, so the line's own buffer never caps a link the brief shapes).
const CHUNKS: usize = 64;
const CHUNK: usize = 64 << 10;

/// A listener that forwards each connection to one address, `delay` late each way; it stops
/// accepting when dropped (connections already made run until either side closes).
pub struct DelayLine {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<Option<()>>>,
}

impl DelayLine {
    /// Listens on `listen` in network namespace `ns` (this process's own when `None`) and
    /// forwards every connection to `to`, reached from that namespace.
    pub fn start(ns: Option<&str>, listen: SocketAddr, to: SocketAddr, delay: Duration) -> io::Result<DelayLine> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let (addr, accept) =
            listen_in(ns, listen, "delay-line", move |listener| match listener.set_nonblocking(true) {
                Ok(()) => accept_until(&listener, to, delay, &stopped),
                Err(e) => tracing::warn!("delay line to {to}: {e}"),
            })?;
        Ok(DelayLine { addr, stop, accept: Some(accept) })
    }

    /// Where the line listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Starts thread `name`, which enters network namespace `ns` (stays in this process's own when
/// `None`), listens on `addr` and runs `serve` on the listener: where it listens and the
/// thread, or why it could not listen. (`setns` moves only the calling thread and the threads
/// it starts later, so the listener and everything `serve` starts live in `ns`.)
pub(super) fn listen_in<T: Send + 'static>(
    ns: Option<&str>,
    addr: SocketAddr,
    name: &str,
    serve: impl FnOnce(TcpListener) -> T + Send + 'static,
) -> io::Result<(SocketAddr, JoinHandle<Option<T>>)> {
    let (ready, bound) = sync_channel(1);
    let ns = ns.map(str::to_string);
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
        let listener = ns.as_deref().map_or(Ok(()), enter_netns).and_then(|()| TcpListener::bind(addr));
        let at = listener.as_ref().map_err(|e| io::Error::new(e.kind(), e.to_string())).and_then(|l| l.local_addr());
        let _ = ready.send(at);
        listener.ok().map(serve)
    })?;
    let at = bound.recv().map_err(|_| io::Error::other(format!("the {name} thread ended")))??;
    Ok((at, thread))
}

/// Accepts until `stop`, polling: a blocked accept could only be woken by a connection from
/// inside the namespace.
fn accept_until(listener: &TcpListener, to: SocketAddr, delay: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((near, _)) => {
                // A thread each (in this thread's namespace): a server still starting holds
                // up only the connection that waits for it.
                let spawned = std::thread::Builder::new().name("delay-connect".into()).spawn(move || {
                    if let Err(e) = forward(near, to, delay) {
                        tracing::warn!("delay line to {to}: {e}");
                    }
                });
                if let Err(e) = spawned {
                    tracing::warn!("delay line to {to}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                tracing::warn!("delay line to {to}: accept: {e}");
                return;
            }
        }
    }
}

/// How long a connection waits for the server behind the line to listen: a trainer that
/// reaches the line before its server has started would otherwise see its connection reset.
const FAR_START: Duration = Duration::from_secs(60);

/// Connects `near` to `to` through two delayed pumps, one each way.
fn forward(near: TcpStream, to: SocketAddr, delay: Duration) -> io::Result<()> {
    near.set_nonblocking(false)?;
    let far = connect_when_listening(to)?;
    for s in [&near, &far] {
        s.set_nodelay(true)?;
    }
    let (near2, far2) = (near.try_clone()?, far.try_clone()?);
    pump(near, far, delay)?;
    pump(far2, near2, delay)
}

/// Connects to `to`, trying again while it refuses, for up to [`FAR_START`].
fn connect_when_listening(to: SocketAddr) -> io::Result<TcpStream> {
    let until = Instant::now() + FAR_START;
    loop {
        match TcpStream::connect(to) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            done => return done,
        }
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read: a reader thread stamps the
/// chunks, a writer thread sleeps until each is due. At the end of `from` the writer closes
/// `to`'s sending side, so the far end sees the close too.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> io::Result<()> {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(CHUNKS);
    std::thread::Builder::new().name("delay-read".into()).spawn(move || loop {
        let mut buf = vec![0; CHUNK];
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf.truncate(n);
                if tx.send((Instant::now() + delay, buf)).is_err() {
                    let _ = from.shutdown(Shutdown::Read);
                    return;
                }
            }
        }
    })?;
    std::thread::Builder::new().name("delay-write".into()).spawn(move || {
        fine_timer();
        for (due, buf) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&buf).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    })?;
    Ok(())
}

/// Lets this thread's sleeps end within a microsecond of when they are due: Linux lets a
/// sleep run up to 50 µs late by default, which at a 100 µs delay would be half of it.
fn fine_timer() {
    // SAFETY: PR_SET_TIMERSLACK takes a number and changes only the calling thread's slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

/// The median round trip of `count` one-byte exchanges from network namespace `from_ns` to an
/// echo it starts at `echo` in `echo_ns` (`None`: this process's own), through a
/// [`DelayLine`] there at `line` when one is given: what a trainer on the first host sees of a
/// server on the second.
pub fn round_trip(
    from_ns: Option<&str>,
    echo_ns: Option<&str>,
    echo: SocketAddr,
    line: Option<(SocketAddr, Duration)>,
    count: usize,
) -> io::Result<Duration> {
    let (echo, server) = listen_in(echo_ns, echo, "echo", |l| -> io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    })?;
    let delay_line = match line {
        Some((at, delay)) => Some(DelayLine::start(echo_ns, at, echo, delay)?),
        None => None,
    };
    let target = delay_line.as_ref().map_or(echo, DelayLine::addr);
    let from_ns = from_ns.map(str::to_string);
    let probe = std::thread::spawn(move || -> io::Result<Vec<Duration>> {
        from_ns.as_deref().map_or(Ok(()), enter_netns)?;
        let mut s = TcpStream::connect(target)?;
        s.set_nodelay(true)?;
        let mut times = Vec::with_capacity(count);
        let mut b = [7u8; 1];
        for _ in 0..count {
            let t = Instant::now();
            s.write_all(&b)?;
            s.read_exact(&mut b)?;
            times.push(t.elapsed());
        }
        Ok(times)
    });
    let mut times = probe.join().map_err(|_| io::Error::other("the round-trip probe panicked"))??;
    drop(delay_line);
    server.join().map_err(|_| io::Error::other("the echo panicked"))?.transpose()?;
    times.sort();
    times.get(times.len() / 2).copied().ok_or_else(|| io::Error::other("no round trip measured"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback, no namespace: every byte arrives in order both ways, no round trip is shorter
    /// than twice the delay, and a close on one side reaches the other.
    #[test]
    fn a_delay_line_delays_every_round_trip_and_passes_every_byte_and_the_close() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = server.local_addr().unwrap();
        let delay = Duration::from_millis(15);
        let line = DelayLine::start(None, "127.0.0.1:0".parse().unwrap(), to, delay).unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = server.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap(); // until the client's close passes the line
            s.write_all(&got).unwrap();
            got.len()
        });
        let mut c = TcpStream::connect(line.addr()).unwrap();
        let sent: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        let t = Instant::now();
        c.write_all(&sent).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert!(t.elapsed() >= 2 * delay, "a round trip took {:?}, under twice the delay", t.elapsed());
        assert_eq!(echo.join().unwrap(), sent.len());
        assert!(back == sent, "the bytes came back changed ({} of {})", back.len(), sent.len());
    }

    #[test]
    fn round_trips_through_a_delay_line_take_at_least_twice_its_delay() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let delay = Duration::from_millis(3);
        let direct = round_trip(None, None, any, None, 20).unwrap();
        let delayed = round_trip(None, None, any, Some((any, delay)), 20).unwrap();
        assert!(delayed >= 2 * delay, "median round trip {delayed:?} through a {delay:?} line (direct: {direct:?})");
    }

    /// A client that reaches the line before the server listens is connected once it does,
    /// not reset.
    #[test]
    fn a_delay_line_waits_for_a_server_that_is_still_starting() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // free now
        let line = DelayLine::start(None, "127.0.0.1:0".parse().unwrap(), port, Duration::ZERO).unwrap();
        let mut c = TcpStream::connect(line.addr()).unwrap();
        c.write_all(b"early").unwrap();
        let server = TcpListener::bind(port).unwrap(); // the server starts after the client
        let (mut s, _) = server.accept().unwrap();
        let mut got = [0u8; 5];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"early");
    }

    #[test]
    fn a_delay_line_that_cannot_listen_says_why() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = taken.local_addr().unwrap();
        let e = DelayLine::start(None, at, at, Duration::ZERO).err().expect("the address is taken");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
