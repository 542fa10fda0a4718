//! A call that survives a lost server: every frame is written to every server before any reply
//! is read; a server lost on the way (broken connection, nobody listening, a replaced epoch) is,
//! with recovery on (`--recover-timeout`), reconnected until the window ends, told again what it
//! must know of this trainer (its declaration, its ended pass), and sent only its own part of
//! the call again. A push sent again this way is counted once by the server (its ledger).

use std::time::{Duration, Instant};

use super::conn::Conn;
use super::{Client, ClientError};
use crate::protocol::{Frame, Request};

impl Client {
    /// Opens every port of server `s` again, and tells the (restarted) server what it must know
    /// of this trainer: the declaration, and the pass it ended.
    fn reconnect(&mut self, s: usize, deadline: Instant) -> Result<(), ClientError> {
        let mut fresh = Vec::with_capacity(self.conns.len());
        let mut epoch = self.epochs[s];
        for port in 0..self.conns.len() {
            let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
            let (conn, e) = Self::open(&self.config, s, port, epoch, wait)?;
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
        for (row, conn) in self.conns.iter_mut().zip(fresh) {
            row[s] = conn;
        }
        self.epochs[s] = epoch;
        Ok(())
    }

    /// After `error` lost server `s` mid-call: with recovery on, reconnects (until the
    /// recovery window ends) and runs `again` (the call's part for `s`), as often as it takes.
    fn recover<T>(
        &mut self,
        s: usize,
        error: ClientError,
        mut again: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let Some(window) = self.config.recover.filter(|_| error.is_lost_server()) else { return Err(error) };
        let started = Instant::now();
        let deadline = started + window;
        let addr = self.config.servers[s].clone();
        tracing::warn!(server = s, %addr, "lost server {s} ({error}); waiting up to {window:?} for it to come back");
        let mut last = error;
        loop {
            if Instant::now() >= deadline {
                return Err(ClientError::Lost { index: s, addr, waited: window, cause: last.to_string() });
            }
            let attempt = self.reconnect(s, deadline).and_then(|()| again(self));
            match attempt {
                Ok(v) => {
                    let seconds = started.elapsed().as_secs_f64();
                    tracing::warn!(server = s, epoch = self.epochs[s], seconds, "server {s} is back; going on");
                    return Ok(v);
                }
                Err(e) if e.is_lost_server() => {
                    last = e;
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
    /// reply, then reads server `s`'s replies with `read(conns, s)`, in server order. A server
    /// lost on the way is, with recovery on, reconnected and sent its frames again alone, before
    /// the next server's reply is read.
    pub(super) fn exchange<T>(
        &mut self,
        parts: &[Vec<(usize, Frame<'_>)>],
        read: impl FnMut(&mut [Vec<Conn>], usize) -> Result<T, ClientError>,
    ) -> Result<Vec<T>, ClientError> {
        self.exchange_then(parts, || {}, read)
    }

    /// [`Client::exchange`], calling `sent` once every frame is written and before any reply
    /// is read (where a planted fault kills a trainer with its push pending).
    pub(super) fn exchange_then<T>(
        &mut self,
        parts: &[Vec<(usize, Frame<'_>)>],
        sent: impl FnOnce(),
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
        }
        sent();
        // A lost server is brought back before the next server's reply is read: in a sync
        // step that reply may wait for another trainer that itself waits, at the restarted
        // server, for this trainer's part.
        let mut out = Vec::with_capacity(parts.len());
        for (s, gone) in lost.into_iter().enumerate() {
            let first = match gone {
                Some(error) => Err(error),
                None => read(&mut self.conns, s),
            };
            let v = match first {
                Ok(v) => v,
                Err(e) => {
                    let error = keep(e)?;
                    self.recover(s, error, |client| {
                        for (port, frame) in &parts[s] {
                            client.conns[*port][s].send(frame)?;
                        }
                        read(&mut client.conns, s)
                    })?
                }
            };
            out.push(v);
        }
        Ok(out)
    }
}
