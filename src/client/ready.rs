//! Which of a call's connections has something to read: a reply, or its server's close.
//!
//! A trainer reads a call's replies as they come rather than in server order. In a sync step a
//! reply can wait for another trainer, and that trainer can be waiting, at a server restarted
//! meanwhile, for this trainer's part of the same call: a trainer blocked on the first server
//! would never see that the other one closed, and both would wait until the sync timeout. With
//! `poll(2)` it sees the close, and brings that server back first.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::conn::Wire;

impl Wire {
    /// The socket under the connection.
    pub(super) fn fd(&self) -> RawFd {
        match self {
            Wire::Plain(s) => s.as_raw_fd(),
            Wire::Tls(s) => s.sock.as_raw_fd(),
        }
    }

    /// Whether a read would return bytes without the socket: TLS plaintext already decrypted,
    /// which `poll` cannot see. A TLS error also counts: the read is where it is reported.
    pub(super) fn buffered(&mut self) -> bool {
        match self {
            Wire::Plain(_) => false,
            Wire::Tls(s) => s.conn.process_new_packets().map_or(true, |state| state.plaintext_bytes_to_read() > 0),
        }
    }
}

/// The position in `sockets` of the first with bytes (or a close, or an error) to read, waiting
/// at most `timeout`; `None` if none had any by then. (Bytes a TLS layer holds already
/// decrypted are not the socket's: see [`Wire::buffered`].)
pub(super) fn first_ready(sockets: &[RawFd], timeout: Duration) -> std::io::Result<Option<usize>> {
    let mut fds: Vec<libc::pollfd> =
        sockets.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 }).collect();
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live, initialized array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Any event counts: data, the peer's close (RDHUP, HUP), an error (ERR, NVAL).
        return Ok(fds.iter().position(|f| f.revents != 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// Three connected pairs: (the client's wires, the server ends).
    fn pairs() -> (Vec<Wire>, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut wires = Vec::new();
        let mut ends = Vec::new();
        for _ in 0..3 {
            wires.push(Wire::Plain(TcpStream::connect(addr).unwrap()));
            ends.push(listener.accept().unwrap().0);
        }
        (wires, ends)
    }

    #[test]
    fn finds_the_connection_with_a_reply_or_a_close_and_times_out_on_silence() {
        let (mut wires, mut ends) = pairs();
        assert!(wires.iter_mut().all(|w| !w.buffered()), "plain TCP holds nothing of its own");
        let fds: Vec<RawFd> = wires.iter().map(Wire::fd).collect();
        let timeout = Duration::from_millis(50);
        assert_eq!(first_ready(&fds, timeout).unwrap(), None, "nothing sent, nothing closed");
        ends[2].write_all(b"reply").unwrap();
        assert_eq!(first_ready(&fds, timeout).unwrap(), Some(2), "a reply");
        ends.remove(1); // server 1's end closes, as a killed process's does
        assert_eq!(first_ready(&fds[..2], Duration::from_secs(10)).unwrap(), Some(1), "a close");
    }
}
