//! A call that survives a lost server: every frame is written to every server before any reply
//! is read, and the replies are read as they come (`ready.rs`); a server lost on the way (broken
//! connection, nobody listening, a replaced epoch) is, with recovery on (`--recover-timeout`),
//! reconnected until the window ends as soon as it is found lost, told again what it must know
//! of this trainer (its declaration, its ended pass), and sent only its own part of the call
//! again. A push sent again this way is counted once by the server (its ledger). A wait the
//! server gave up on (a sync step or barrier past its `--timeout`) is sent again on the same
//! connections while the window lasts. `on_first` is the same for a request to server 0 alone.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::{Client, ClientError};
use crate::protocol::{Frame, Request};

impl Client {
    /// Opens every port of server `s` again, and tells the (restarted) server what it must know
    /// of this trainer: the declaration, the pass it ended, and the day ends it shrank at.
    fn reconnect(&mut self, s: usize, deadline: Instant) -> Result<(), ClientError> {
        let mut fresh = Vec::with_capacity(self.conns.len());
        let mut epoch = self.epochs[s];
        for port in 0..self.conns.len() {
            let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
            let (conn, e) = super::open::open(&self.config, s, port, epoch, wait)?;
            epoch = epoch.max(e);
            fresh.push(conn);
        }
        if let Some(declaration) = &self.declared {
            fresh[0].send(&Request::Declare(declaration.clone()).encode())?;
            fresh[0].expect_done("the table declaration")?;
        }
        if let Some((trainer, pass)) = self.ended {
            fresh[0].send(&Request::EndPass { trainer, pass }.encode())?;
            fresh[0].expect_done("an end of pass")?;
        }
        for &day_end in &self.day_ends {
            fresh[0].send(&Request::Shrink { days: 1, day_end }.encode())?;
            fresh[0].expect_json("a day end's shrink")?;
        }
        for (row, conn) in self.conns.iter_mut().zip(fresh) {
            row[s] = conn;
        }
        self.epochs[s] = epoch;
        Ok(())
    }

    /// After `error` lost server `s` mid-call: with recovery on, reconnects (until the
    /// recovery window ends) and runs `again` (the call's part for `s`), as often as it takes.
    /// A wait the server gave up on (a sync step or barrier past its `--timeout`) is asked
    /// again the same way, without reconnecting: the trainer it waits for may itself be
    /// recovering (a cut link, a restarted server), and every such request is idempotent at
    /// the server (a push or commit of the pending step takes its place once, a barrier
    /// records the same epoch).
    fn recover<T>(
        &mut self,
        s: usize,
        error: ClientError,
        mut again: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let worth = |e: &ClientError| e.is_lost_server() || e.is_wait_timed_out();
        // A window of 0 (`--recover-timeout 0`) is no recovery: the error as it came.
        let Some(window) = self.config.recover.filter(|w| !w.is_zero() && worth(&error)) else { return Err(error) };
        let started = Instant::now();
        let deadline = started + window;
        let addr = self.config.servers[s].clone();
        if error.is_wait_timed_out() {
            tracing::warn!(server = s, "{error}; asking again for up to {window:?} (--recover-timeout)");
        } else {
            tracing::warn!(server = s, %addr, "lost server {s} ({error}); waiting up to {window:?} for it to come back");
        }
        let mut last = error;
        loop {
            if Instant::now() >= deadline {
                return Err(out_of_window(s, addr, window, started.elapsed(), last));
            }
            let attempt = if last.is_lost_server() {
                self.reconnect(s, deadline).and_then(|()| again(self))
            } else {
                again(self)
            };
            match attempt {
                Ok(v) => {
                    let seconds = started.elapsed().as_secs_f64();
                    if last.is_lost_server() {
                        tracing::warn!(server = s, epoch = self.epochs[s], seconds, "server {s} is back; going on");
                    } else {
                        tracing::warn!(server = s, seconds, "server {s}'s wait ended; going on");
                    }
                    return Ok(v);
                }
                Err(e) if worth(&e) => {
                    last = e;
                    // A pause, so a server that refuses at once (a timeout of 0) is not asked
                    // in a tight loop.
                    std::thread::sleep(
                        Duration::from_millis(50).min(deadline.saturating_duration_since(Instant::now())),
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends `request` to server 0 alone (barriers, the pass AUC) and reads its answer with
    /// `read`, through [`Client::exchange`].
    pub(super) fn on_first<T>(
        &mut self,
        request: &Request,
        mut read: impl FnMut(&mut Conn) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let port = self.pick(false);
        let mut parts: Vec<Vec<(usize, Frame)>> = (0..self.servers()).map(|_| Vec::new()).collect();
        parts[0].push((port, request.encode()));
        let mut answers =
            self.exchange(&parts, |conns, s| if s == 0 { read(&mut conns[port][0]).map(Some) } else { Ok(None) })?;
        Ok(answers.swap_remove(0).expect("server 0 was asked"))
    }

    /// Sends each server its frames (`parts[s]`: (port, frame) pairs), all before reading any
    /// reply, then reads server `s`'s replies with `read(conns, s)` as they come (see
    /// [`super::ready`]). A server lost on the way is, with recovery on, reconnected and sent
    /// its frames again alone, as soon as it is found lost.
    pub(super) fn exchange<T>(
        &mut self,
        parts: &[Vec<(usize, Frame<'_>)>],
        read: impl FnMut(&mut [Vec<Conn>], usize) -> Result<T, ClientError>,
    ) -> Result<Vec<T>, ClientError> {
        self.exchange_then(parts, |_| {}, read)
    }

    /// [`Client::exchange`], calling `sent(s)` once server `s`'s frames are written (in server
    /// order) and before any reply is read (where a planted fault kills a trainer with its push
    /// pending at some servers or all).
    pub(super) fn exchange_then<T>(
        &mut self,
        parts: &[Vec<(usize, Frame<'_>)>],
        mut sent: impl FnMut(usize),
        mut read: impl FnMut(&mut [Vec<Conn>], usize) -> Result<T, ClientError>,
    ) -> Result<Vec<T>, ClientError> {
        let recovering = self.config.recover.is_some();
        let keep = |e: ClientError| if recovering && e.is_lost_server() { Ok(e) } else { Err(e) };
        let mut lost: Vec<Option<ClientError>> = parts.iter().map(|_| None).collect();
        for (s, frames) in parts.iter().enumerate() {
            for (port, frame) in frames {
                if let Err(e) = self.conns[*port][s].send(frame) {
                    lost[s] = Some(keep(e)?);
                    break;
                }
            }
            sent(s);
        }
        let replies = Instant::now();
        // Replies are read as they come, a lost server first: read in server order, a reply
        // could wait (a sync step) for a trainer that itself waits, at a server lost
        // meanwhile, for this trainer's part (see `ready`).
        let mut out: Vec<Option<T>> = parts.iter().map(|_| None).collect();
        let mut waiting: Vec<usize> = (0..parts.len()).collect();
        while !waiting.is_empty() {
            let (k, silent) = match waiting.iter().position(|&s| lost[s].is_some()) {
                Some(k) => (k, false),
                None => self.next_ready(&waiting, parts),
            };
            let s = waiting.remove(k);
            let first = match lost[s].take() {
                Some(error) => Err(error),
                None if silent => {
                    let conn = &self.conns[parts[s][0].0][s];
                    let waited = self.config.reply_timeout;
                    let e = std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no reply within {waited:?}"));
                    Err(conn.fail(crate::protocol::ProtocolError::Io(e)))
                }
                None => read(&mut self.conns, s),
            };
            let v = match first {
                Ok(v) => v,
                // Without recovery (or for an error neither a restart nor a wait cures) this is
                // the error.
                Err(e) => self.recover(s, e, |client| {
                    for (port, frame) in &parts[s] {
                        client.conns[*port][s].send(frame)?;
                    }
                    read(&mut client.conns, s)
                })?,
            };
            out[s] = Some(v);
        }
        let waited = replies.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        super::REPLY_NANOS.fetch_add(waited, Relaxed);
        Ok(out.into_iter().map(|v| v.expect("every server has answered")).collect())
    }

    /// Of `waiting` (servers whose replies are unread), the position of one to read now, and
    /// whether it stayed silent: one that was sent nothing (its `read` reads nothing), else the
    /// first whose connection has a reply or was closed; the first, silent, if none had either
    /// within the reply timeout.
    fn next_ready(&mut self, waiting: &[usize], parts: &[Vec<(usize, Frame<'_>)>]) -> (usize, bool) {
        if let Some(k) = waiting.iter().position(|&s| parts[s].is_empty()) {
            return (k, false);
        }
        // A server's reply comes first on the port of its first frame.
        let first: Vec<(usize, usize)> = waiting.iter().map(|&s| (parts[s][0].0, s)).collect();
        if let Some(k) = first.iter().position(|&(port, s)| self.conns[port][s].stream.buffered()) {
            return (k, false);
        }
        let sockets: Vec<_> = first.iter().map(|&(port, s)| self.conns[port][s].stream.fd()).collect();
        match super::ready::first_ready(&sockets, self.config.reply_timeout) {
            Ok(Some(k)) => (k, false),
            Ok(None) => (0, true),
            // poll(2) itself failed (it does not for valid descriptors): read in order.
            Err(_) => (0, false),
        }
    }
}

/// The error once the recovery window has ended: the server was lost (and is named so), or it
/// still refused its wait, with how long the refusals were asked again (up to one of the
/// server's timeouts past the window: the last ask began inside it).
fn out_of_window(s: usize, addr: String, window: Duration, asked: Duration, last: ClientError) -> ClientError {
    match last {
        ClientError::Refused { index, addr, what, code, message } => ClientError::Refused {
            index,
            addr,
            what,
            code,
            message: format!(
                "{message}; asked again for {:.1}s, past the recovery window of {window:?} (--recover-timeout)",
                asked.as_secs_f64()
            ),
        },
        last => ClientError::Lost { index: s, addr, waited: window, cause: last.to_string() },
    }
}
