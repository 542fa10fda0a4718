//! One connection to one port of one server ([`Wire`]: plain TCP, or TLS over it, its TLS
//! handshake done at connect and a close_notify sent on drop): sending a frame, reading a reply
//! within its deadline ([`Deadline`]: a whole reply within the reply timeout, the socket's timeout
//! set to the time left before each read), a server's error kept with its code
//! ([`ClientError::Refused`]), the secret's challenge and response, and connecting with backoff
//! while a server starts.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::ClientError;
use crate::protocol::{
    read_frame_blocking, write_frame_blocking, Frame, FrameBuf, ProtocolError, Response, DEFAULT_MAX_FRAME,
};

/// A connection's bytes: plain TCP, or TLS over it (`--tls-ca`).
pub(super) enum Wire {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Wire {
    /// Wraps `tcp` in TLS when configured, completing the TLS handshake (bounded by the
    /// socket's read timeout) so that a server with the wrong certificate fails here, named.
    pub(super) fn new(tcp: TcpStream, tls: Option<&crate::security::tls::ClientTls>) -> std::io::Result<Wire> {
        let Some(tls) = tls else { return Ok(Wire::Plain(tcp)) };
        let connection = rustls::ClientConnection::new(tls.config.clone(), tls.name.clone())
            .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
        let mut stream = rustls::StreamOwned::new(connection, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock).map_err(|e| {
                std::io::Error::new(e.kind(), format!("TLS handshake (is the server started with --tls-cert?): {e}"))
            })?;
        }
        Ok(Wire::Tls(Box::new(stream)))
    }
}

impl Drop for Wire {
    /// Ends TLS with its close_notify, so the server sees a close, not a cut connection; a
    /// server that does not take it within a second is left.
    fn drop(&mut self) {
        if let Wire::Tls(s) = self {
            use std::io::Write;
            s.conn.send_close_notify();
            let _ = s.sock.set_write_timeout(Some(std::time::Duration::from_secs(1)));
            let _ = s.flush();
        }
    }
}

impl std::io::Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => s.read(buf),
            Wire::Tls(s) => s.read(buf),
        }
    }
}

impl std::io::Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => s.write(buf),
            Wire::Tls(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Wire::Plain(s) => s.write_vectored(bufs),
            Wire::Tls(s) => rustls::Stream::new(&mut s.conn, &mut s.sock).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Wire::Plain(s) => s.flush(),
            Wire::Tls(s) => s.flush(),
        }
    }
}

/// A connection read within one deadline for a whole reply: the socket's timeout is set to
/// the time left before each read. A socket timeout alone bounds each read, so a peer sending
/// a byte a second held a trainer (or `oar shrink`) for good.
pub(super) struct Deadline<'a> {
    wire: &'a mut Wire,
    /// The socket's read timeout as last set.
    armed: &'a mut Duration,
    until: Instant,
    timeout: Duration,
}

impl<'a> Deadline<'a> {
    /// Reads from `wire` (whose socket read timeout is `armed`) for at most `timeout` from now.
    pub(super) fn new(wire: &'a mut Wire, armed: &'a mut Duration, timeout: Duration) -> Deadline<'a> {
        Deadline { wire, armed, until: Instant::now() + timeout, timeout }
    }

    fn arm(&mut self, left: Duration) -> std::io::Result<()> {
        let tcp = match &*self.wire {
            Wire::Plain(s) => s,
            Wire::Tls(s) => &s.sock,
        };
        tcp.set_read_timeout(Some(left))?;
        *self.armed = left;
        Ok(())
    }

    fn late(&self) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no whole reply within {:?} (the reply timeout, --timeout)", self.timeout),
        )
    }
}

impl std::io::Read for Deadline<'_> {
    /// The socket's timeout is set again only when a read could otherwise run past the
    /// deadline by more than a 16th of the timeout, or has stopped short of it: a system call
    /// before every read cost about 5% of a 2x2 job's samples/s.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let left = self.until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.late());
            }
            if self.armed.saturating_sub(left) > self.timeout / 16 {
                self.arm(left)?;
            }
            match self.wire.read(buf) {
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    // The socket's timeout ran out: the deadline too, or a shorter timeout
                    // armed for an earlier reply, which is set to the time left and retried.
                    let left = self.until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.late());
                    }
                    self.arm(left)?;
                }
                r => return r,
            }
        }
    }
}

pub(super) struct Conn {
    pub(super) index: usize,
    pub(super) addr: String,
    pub(super) stream: Wire,
    /// The longest a whole reply may take to arrive.
    pub(super) reply_timeout: Duration,
    /// The socket's read timeout as last set ([`Deadline`]).
    pub(super) armed: Duration,
    pub(super) buf: FrameBuf,
}

impl Conn {
    pub(super) fn fail(&self, cause: ProtocolError) -> ClientError {
        ClientError::Protocol { index: self.index, addr: self.addr.clone(), cause }
    }

    pub(super) fn send(&mut self, frame: &Frame) -> Result<(), ClientError> {
        write_frame_blocking(&mut self.stream, frame).map_err(|e| self.fail(e))
    }

    /// Reads the next reply frame into the connection's buffer; returns its kind.
    pub(super) fn read(&mut self) -> Result<u8, ClientError> {
        let mut within = Deadline::new(&mut self.stream, &mut self.armed, self.reply_timeout);
        read_frame_blocking(&mut within, &mut self.buf, DEFAULT_MAX_FRAME).map_err(|e| self.fail(e))
    }

    /// Decodes the frame just read (borrowing from the buffer); a server error becomes `Refused`.
    pub(super) fn reply(&self, kind: u8, what: &'static str) -> Result<Response<'_>, ClientError> {
        match Response::decode(kind, self.buf.payload()).map_err(|e| self.fail(e))? {
            Response::Error { code, message } => {
                Err(ClientError::Refused { index: self.index, addr: self.addr.clone(), what, code, message })
            }
            r => Ok(r),
        }
    }

    pub(super) fn unexpected(&self, what: &'static str, got: &Response) -> ClientError {
        self.mismatch(what, format!("{got:?}").chars().take(80).collect())
    }

    pub(super) fn mismatch(&self, what: &'static str, got: String) -> ClientError {
        ClientError::Unexpected { index: self.index, addr: self.addr.clone(), what, got }
    }

    /// Proves this client holds the key of its identity in `job` (a credential's, or any with
    /// the master) and checks the server's proof, for the server index it dialed (see
    /// [`crate::security::auth`]), before any other frame. Returns the server's epoch as it proved it.
    pub(super) fn authenticate(
        &mut self,
        secret: &crate::security::auth::Secret,
        job: &str,
        identity: crate::security::auth::Identity,
    ) -> Result<u64, ClientError> {
        use crate::protocol::auth;
        use std::io::Write;
        let ours = crate::security::auth::nonce();
        let server = self.index as u64;
        self.stream
            .write_all(&auth::hello(&ours, identity, server))
            .and_then(|_| self.stream.flush())
            .map_err(|e| self.fail(e.into()))?;
        let kind = self.read()?;
        if kind != auth::AUTH_CHALLENGE {
            return Err(match self.reply(kind, "the authentication") {
                Err(e) => e,
                Ok(other) => self.unexpected("the authentication", &other),
            });
        }
        let Some((theirs, epoch, proof)) = auth::parse_challenge(self.buf.payload()) else {
            return Err(self.mismatch("the authentication", "a malformed challenge".into()));
        };
        let claim = crate::security::auth::Claim { job, identity, server, epoch };
        if !secret.is_server_proof(&claim, &ours, &theirs, &proof) {
            let why = format!(
                "the server did not prove it is server {server} of job '{job}' (another job's or another server's, \
                 a relay, or a wrong --secret-file)"
            );
            return Err(ClientError::Unproven { index: self.index, addr: self.addr.clone(), why });
        }
        let mine = secret.client_proof(&claim, &theirs, &ours).expect("checked: this secret proves the claim");
        self.stream
            .write_all(&auth::proof(&mine))
            .and_then(|_| self.stream.flush())
            .map_err(|e| self.fail(e.into()))?;
        self.expect_done("the authentication")?;
        Ok(epoch)
    }

    /// Expects a `Stats` (JSON) reply, and drops it.
    pub(super) fn expect_json(&mut self, what: &'static str) -> Result<(), ClientError> {
        let kind = self.read()?;
        match self.reply(kind, what)? {
            Response::Stats(_) => Ok(()),
            other => Err(self.unexpected(what, &other)),
        }
    }

    /// Expects a `Done` reply.
    pub(super) fn expect_done(&mut self, what: &'static str) -> Result<(), ClientError> {
        let kind = self.read()?;
        match self.reply(kind, what)? {
            Response::Done => Ok(()),
            other => Err(self.unexpected(what, &other)),
        }
    }
}

/// The longest one connect attempt waits for the server's answer. A link that drops packets
/// (cut, or a host not there yet) loses the SYN, and the kernel sends it again after 1, 3, 7, 15
/// and 31 s: within one long attempt, a link that heals is found only at the next of those. A
/// fresh attempt every few seconds finds it within seconds (the keepalive of a server that lost
/// this trainer behind the cut gives up on it about a minute into the cut). 5 s outlasts the
/// kernel's address resolution on a subnet (3 probes 1 s apart), so a host that is down is
/// named as such ("No route to host"), not as a timeout.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

/// Connects to `addr`, retrying with backoff until `timeout` (a server may still be starting).
pub(super) fn connect_with_retry(index: usize, addr: &str, timeout: Duration) -> Result<TcpStream, ClientError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(20);
    loop {
        let attempt = addr
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| std::io::Error::other("address resolves to nothing")))
            .and_then(|sa| {
                let left = deadline.saturating_duration_since(Instant::now());
                TcpStream::connect_timeout(&sa, left.min(CONNECT_ATTEMPT).max(Duration::from_millis(10)))
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(ClientError::Unreachable { index, addr: addr.to_string(), timeout, cause: e.to_string() })
            }
            // A server that is still starting refuses connections: back off and try again.
            Err(_) => {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}
