//! Reading and writing frames, async (server) and blocking (trainer). A receive buffer
//! ([`FrameBuf`]) grows with the bytes that arrive, never with what a frame's header claims, and
//! shrinks back once large frames stop coming; a server's connections' buffers together hold at
//! most their [`BufferBudget`].

use std::io::IoSlice;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Frame, ProtocolError, HEADER};

/// A reusable, 8-byte aligned receive buffer.
#[derive(Default)]
pub struct FrameBuf {
    words: Vec<u64>,
    len: usize,
    /// The budget this buffer's bytes count against (a server's connections share one).
    budget: Option<std::sync::Arc<BufferBudget>>,
    /// Payload lengths of the last few frames, newest last: the buffer shrinks back once a
    /// large frame is no longer among them.
    recent: [usize; RECENT],
    next: usize,
}

/// Frames whose lengths decide how much of its buffer a connection keeps.
const RECENT: usize = 16;
/// What a buffer keeps at the least, and grows by at first: 64 KiB.
const FIRST: usize = 64 << 10;

impl FrameBuf {
    /// The payload of the last frame read.
    pub fn payload(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// A buffer whose bytes count against `budget`.
    pub fn budgeted(budget: std::sync::Arc<BufferBudget>) -> FrameBuf {
        let mut buf = FrameBuf::default();
        buf.budget = Some(budget);
        buf
    }

    /// Bytes this buffer holds.
    pub fn capacity(&self) -> usize {
        self.words.len() * 8
    }

    /// Gives back what the last frames do not need: everything past 64 KiB after a refused
    /// request (`refused`), or past twice the largest of the last 16 frames otherwise. A peer's
    /// one huge frame is not held for the rest of its connection's life.
    pub fn shrink(&mut self, refused: bool) {
        let keep = if refused { FIRST } else { self.recent.iter().max().map_or(FIRST, |m| (2 * m).max(FIRST)) };
        if self.capacity() > keep {
            let words = keep.div_ceil(8);
            let freed = (self.words.len() - words) * 8;
            self.words.truncate(words);
            self.words.shrink_to_fit();
            if let Some(b) = &self.budget {
                b.give(freed);
            }
        }
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.capacity());
        }
    }
}

/// The bytes a server's connections' buffers may hold together, or a part of those (one peer's
/// share, see `server::shares`): bytes a part takes count against it and against the whole.
#[derive(Debug)]
pub struct BufferBudget {
    held: std::sync::atomic::AtomicUsize,
    most: usize,
    whole: Option<std::sync::Arc<BufferBudget>>,
}

impl BufferBudget {
    /// A budget of `most` bytes.
    pub fn new(most: usize) -> std::sync::Arc<BufferBudget> {
        std::sync::Arc::new(BufferBudget { held: 0.into(), most, whole: None })
    }

    /// A part of `whole` of at most `most` bytes.
    pub fn part(whole: &std::sync::Arc<BufferBudget>, most: usize) -> std::sync::Arc<BufferBudget> {
        std::sync::Arc::new(BufferBudget { held: 0.into(), most, whole: Some(whole.clone()) })
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most it holds.
    pub fn most(&self) -> usize {
        self.most
    }

    /// Takes `bytes`, here and in the whole; if either would go past its bound, takes nothing
    /// and returns what the one refusing holds and its bound.
    pub fn take(&self, bytes: usize) -> Result<(), (usize, usize)> {
        use std::sync::atomic::Ordering::Relaxed;
        let reserve = |h: usize| h.checked_add(bytes).filter(|&n| n <= self.most);
        self.held.fetch_update(Relaxed, Relaxed, reserve).map_err(|held| (held, self.most))?;
        if let Some(whole) = &self.whole {
            if let Err(refused) = whole.take(bytes) {
                self.held.fetch_sub(bytes, Relaxed);
                return Err(refused);
            }
        }
        Ok(())
    }

    /// Gives back `bytes` taken before.
    pub fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
        if let Some(whole) = &self.whole {
            whole.give(bytes);
        }
    }
}

/// Checks a frame header and returns (payload length, kind).
pub(super) fn parse_header(header: &[u8; HEADER], max: usize) -> Result<(usize, u8), ProtocolError> {
    if let Some(e) = tls_record(header) {
        return Err(e);
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    if header[5..] != [0, 0, 0] {
        return Err(ProtocolError::Malformed("reserved header bytes are not zero".into()));
    }
    if len > max {
        return Err(ProtocolError::TooLarge { len, max });
    }
    Ok((len, header[4]))
}

/// A TLS record where a frame was expected (an alert or a handshake: content type 21 or 22,
/// version 3.x), named: one side was started with TLS and the other without.
fn tls_record(bytes: &[u8]) -> Option<ProtocolError> {
    match bytes {
        [21 | 22, 3, ..] => Some(ProtocolError::Malformed(
            "the peer speaks TLS and this side does not (TLS takes --tls-cert on the servers and --tls-ca on \
             their clients: both or neither)"
                .into(),
        )),
        _ => None,
    }
}

/// Fills `header` from a blocking reader; `Err(Closed)` if the peer closed before its first
/// byte. A peer that closes after a few bytes of a TLS alert is named as speaking TLS.
pub(super) fn read_header_blocking<R: std::io::Read>(
    r: &mut R,
    header: &mut [u8; HEADER],
) -> Result<(), ProtocolError> {
    let mut filled = 0;
    while filled < HEADER {
        match r.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Err(ProtocolError::Closed),
            Ok(0) => {
                return Err(tls_record(&header[..filled])
                    .unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl FrameBuf {
    /// Makes room for `bytes` bytes of a frame of `len` (growing by at least doubling, within
    /// the budget) and returns them.
    pub(super) fn room(&mut self, bytes: usize, len: usize) -> Result<&mut [u8], ProtocolError> {
        let words = bytes.div_ceil(8);
        if self.words.len() < words {
            // Doubling, but never past the frame being read.
            let grown = words.max((self.words.len() * 2).min(len.div_ceil(8)));
            if let Some(b) = &self.budget {
                let extra = (grown - self.words.len()) * 8;
                b.take(extra).map_err(|(held, most)| ProtocolError::OverBudget { len, held, most })?;
            }
            self.words.resize(grown, 0);
        }
        Ok(&mut bytemuck::cast_slice_mut(&mut self.words)[..bytes])
    }

    /// Notes a frame's length for [`shrink`](Self::shrink).
    fn seen(&mut self, len: usize) {
        self.recent[self.next % RECENT] = len;
        self.next += 1;
    }
}

/// Reads one frame into `buf` and returns its kind; `Err(Closed)` if the peer closed cleanly
/// between frames. A payload above `max` is refused before it is read.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut FrameBuf, max: usize) -> Result<u8, ProtocolError> {
    let mut header = [0u8; HEADER];
    let first = match r.read(&mut header).await {
        // TLS reports a peer that closed without its close_notify as an unexpected end: between
        // frames that is a close like any other.
        Ok(0) => return Err(ProtocolError::Closed),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        first => first?,
    };
    r.read_exact(&mut header[first..]).await?;
    let (len, kind) = parse_header(&header, max)?;
    // The buffer grows with the bytes that arrive, not with what the header claims: a peer
    // announcing a huge frame and sending nothing pins no memory.
    let mut filled = 0;
    while filled < len {
        let end = len.min(FIRST.max(filled * 2));
        r.read_exact(&mut buf.room(end, len)?[filled..]).await?;
        filled = end;
    }
    buf.len = len;
    buf.seen(len);
    Ok(kind)
}

/// Blocking twin of [`read_frame`], for the trainer's client.
pub fn read_frame_blocking<R: std::io::Read>(r: &mut R, buf: &mut FrameBuf, max: usize) -> Result<u8, ProtocolError> {
    let mut header = [0u8; HEADER];
    read_header_blocking(r, &mut header)?;
    let (len, kind) = parse_header(&header, max)?;
    buf.fill(r, 0, len, len)?;
    buf.finish(len);
    Ok(kind)
}

impl FrameBuf {
    /// Reads payload bytes `from..to` of a frame of `len` into the buffer, growing it with the
    /// bytes that arrive, not with what the header claims: a peer announcing a 256 MiB frame
    /// and sending a byte a second made a trainer set aside 256 MiB.
    pub(super) fn fill<R: std::io::Read>(
        &mut self,
        r: &mut R,
        from: usize,
        to: usize,
        len: usize,
    ) -> Result<(), ProtocolError> {
        let mut filled = from;
        while filled < to {
            let end = to.min(FIRST.max(filled * 2));
            r.read_exact(&mut self.room(end, len)?[filled..])?;
            filled = end;
        }
        Ok(())
    }

    /// Ends a frame's reading: its payload is the buffer's first `len` bytes.
    pub(super) fn finish(&mut self, len: usize) {
        self.len = len;
        self.seen(len);
    }

    /// Every byte the buffer holds.
    pub(super) fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }

    /// Every byte the buffer holds, to write.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.words)
    }
}

/// Writes a frame with vectored writes.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame<'_>) -> Result<(), ProtocolError> {
    let mut slices = frame.io_slices();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = w.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    // A no-op on TCP; TLS may hold the frame's last record until flushed.
    w.flush().await?;
    Ok(())
}

/// Blocking twin of [`write_frame`], for the trainer's client.
pub fn write_frame_blocking<W: std::io::Write>(w: &mut W, frame: &Frame<'_>) -> Result<(), ProtocolError> {
    let mut slices = frame.io_slices();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = match w.write_vectored(rest) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        IoSlice::advance_slices(&mut rest, n);
    }
    w.flush()?;
    Ok(())
}

/// Splits an encoded frame into kind and payload, copying the payload into an aligned buffer
/// (used by tests and in-process callers that have the bytes already).
pub fn split_frame(frame: &[u8]) -> (u8, FrameBuf) {
    let payload = &frame[HEADER..];
    let mut buf = FrameBuf::default();
    (buf.words, buf.len) = (vec![0; payload.len().div_ceil(8)], payload.len());
    bytemuck::cast_slice_mut::<u64, u8>(&mut buf.words)[..payload.len()].copy_from_slice(payload);
    (frame[4], buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Push, Request, DEFAULT_MAX_FRAME};

    #[tokio::test]
    async fn oversized_frames_are_refused_before_reading() {
        let frame = Request::Push(Push {
            trainer: 0,
            step: 0,
            pass: 1,
            base_version: 0,
            samples: 1,
            part: crate::protocol::PushPart::Whole,
            apply: crate::protocol::Apply::Now,
            dense: vec![vec![0.0; 1000].into()],
            sparse: vec![],
        })
        .encode()
        .to_vec();
        let mut buf = FrameBuf::default();
        let err = read_frame(&mut &frame[..], &mut buf, 100).await.unwrap_err();
        assert!(matches!(err, ProtocolError::TooLarge { max: 100, .. }), "{err}");
        let kind = read_frame(&mut &frame[..], &mut buf, DEFAULT_MAX_FRAME).await.unwrap();
        assert_eq!(kind, frame[4]);
    }

    #[test]
    fn tls_records_where_a_frame_belongs_are_named() {
        let mut buf = FrameBuf::default();
        // A TLS alert (7 bytes, then the peer closes) and a TLS ClientHello's first bytes.
        for bytes in [&[21u8, 3, 3, 0, 2, 2, 40][..], &[22, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3]] {
            let err = read_frame_blocking(&mut &bytes[..], &mut buf, DEFAULT_MAX_FRAME).unwrap_err().to_string();
            assert!(err.contains("speaks TLS"), "{err}");
        }
        // A frame cut short is not taken for TLS; nothing at all is a clean close.
        let err = read_frame_blocking(&mut &[4u8, 0, 0][..], &mut buf, DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::Io(_)), "{err}");
        let err = read_frame_blocking(&mut &[][..], &mut buf, DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, ProtocolError::Closed), "{err}");
    }
}
