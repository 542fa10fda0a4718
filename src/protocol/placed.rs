//! Reading a pull's reply (`Values`) with its large arrays read from the socket straight into
//! the caller's memory: a trainer's dense blocks into their places in the flat parameter vector,
//! and a table's rows into the caller's row array when they come in the caller's order (one
//! server). Each array so placed is left in the receive buffer as an empty one, so the reply
//! still decodes as a whole; the caller knows which it placed. Without this a reply of 1 MiB of
//! rows was read into the buffer and copied out again while the server waited for the next
//! request.

use super::codec::kind;
use super::io::{parse_header, read_header_blocking};
use super::{FrameBuf, ProtocolError, HEADER};

/// An array of a `Values` reply offered to [`read_reply_blocking`]'s placer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValuesArray {
    /// The dense values.
    Dense,
    /// The rows of the reply's `n`th table.
    Rows(usize),
}

/// Reads one frame like [`super::read_frame_blocking`], except that each array of a `Values`
/// response is first offered to `place(reader, array, floats)`. A placer that takes it reads
/// exactly `floats` floats from the reader (their bytes, little-endian) and returns `true`;
/// the array then decodes as empty. One that returns `false` reads nothing, and the array is
/// buffered as usual. Counts that do not fit the frame are never offered: they are buffered,
/// and decoding the reply refuses them.
pub fn read_reply_blocking<R: std::io::Read>(
    r: &mut R,
    buf: &mut FrameBuf,
    max: usize,
    place: &mut Placer<'_>,
) -> Result<u8, ProtocolError> {
    let mut header = [0u8; HEADER];
    read_header_blocking(r, &mut header)?;
    let (len, kind) = parse_header(&header, max)?;
    let mut reply = Reply { r, buf, len, read: 0, at: 0, ahead: 0 };
    if kind == kind::VALUES {
        reply.values(place)?;
    }
    reply.buffer(reply.len - reply.read)?;
    reply.buf.finish(reply.at);
    Ok(kind)
}

/// What [`read_reply_blocking`] offers each array of a `Values` reply to: it reads the array's
/// bytes from the reader it is given.
pub type Placer<'a> = dyn FnMut(&mut dyn std::io::Read, ValuesArray, usize) -> Result<bool, ProtocolError> + 'a;

/// Bytes read ahead at most for a reply's small fields: a reply of many tables costs a few
/// reads, not two for each table.
const AHEAD: usize = 64 << 10;

/// A frame's payload being read: `read` of its `len` bytes are parsed (buffered or placed), of
/// which the buffer holds `at`; the `ahead` bytes after those in the buffer are read from the
/// socket and not parsed yet.
struct Reply<'a, R> {
    r: &'a mut R,
    buf: &'a mut FrameBuf,
    len: usize,
    read: usize,
    at: usize,
    ahead: usize,
}

impl<R: std::io::Read> Reply<'_, R> {
    /// Reads a `Values` payload's fields in order (the version, the dense array, the count of
    /// tables, each table's rows), offering each array to `place`. It stops at the first field
    /// that does not fit: the rest is buffered, and decoding names the fault.
    fn values(&mut self, place: &mut Placer<'_>) -> Result<(), ProtocolError> {
        if self.field()?.is_none() || !self.array(ValuesArray::Dense, place)? {
            return Ok(());
        }
        let Some(tables) = self.field()? else { return Ok(()) };
        for t in 0..tables {
            if !self.array(ValuesArray::Rows(t as usize), place)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The next u64 field, buffered; `None` if the payload has no 8 bytes left.
    fn field(&mut self) -> Result<Option<u64>, ProtocolError> {
        if self.len - self.read < 8 {
            return Ok(None);
        }
        while self.ahead < 8 {
            self.read_ahead()?;
        }
        self.buffer(8)?;
        let bytes = &self.buf.bytes()[self.at - 8..self.at];
        Ok(Some(u64::from_le_bytes(bytes.try_into().expect("8 bytes"))))
    }

    /// One read of what has arrived of the payload, up to [`AHEAD`] bytes, never past the frame.
    fn read_ahead(&mut self) -> Result<(), ProtocolError> {
        let from = self.at + self.ahead;
        let end = from + AHEAD.min(self.len - self.read - self.ahead);
        let n = loop {
            match self.r.read(&mut self.buf.room(end, self.len)?[from..end]) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        };
        self.ahead += n;
        Ok(())
    }

    /// The next array (its count, then its floats padded to 8 bytes): offered to `place`, or
    /// else buffered. `false` if it does not fit the payload (its count is buffered, nothing
    /// more).
    fn array(&mut self, which: ValuesArray, place: &mut Placer<'_>) -> Result<bool, ProtocolError> {
        let Some(floats) = self.field()? else { return Ok(false) };
        let left = (self.len - self.read) as u64;
        let Some(bytes) = floats.checked_mul(4).and_then(|b| b.checked_next_multiple_of(8)).filter(|&b| b <= left)
        else {
            return Ok(false);
        };
        let (floats, bytes) = (floats as usize, bytes as usize);
        // The placer reads what was read ahead first, then the socket.
        let early = (floats * 4).min(self.ahead);
        let placed = floats > 0 && {
            let mut from = std::io::Read::chain(&self.buf.bytes()[self.at..self.at + early], &mut *self.r);
            place(&mut from, which, floats)?
        };
        if !placed {
            self.buffer(bytes)?;
            return Ok(true);
        }
        // Placed: its padding is skipped, what was read ahead past it moves to where it is
        // parsed from, and the buffer holds the array as an empty one.
        let pad = bytes - floats * 4;
        let pad_early = pad.min(self.ahead - early);
        self.r.read_exact(&mut [0u8; 8][..pad - pad_early])?;
        let (at, rest) = (self.at, early + pad_early);
        self.buf.bytes_mut().copy_within(at + rest..at + self.ahead, at);
        self.ahead -= rest;
        self.read += bytes;
        self.buf.bytes_mut()[at - 8..at].fill(0);
        Ok(true)
    }

    /// Moves the next `n` payload bytes into the buffer's kept part, reading what was not read
    /// ahead.
    fn buffer(&mut self, n: usize) -> Result<(), ProtocolError> {
        if self.ahead < n {
            self.buf.fill(self.r, self.at + self.ahead, self.at + n, self.len)?;
            self.ahead = n;
        }
        (self.read, self.at, self.ahead) = (self.read + n, self.at + n, self.ahead - n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{encode_values, read_frame_blocking, Response};

    /// A reply of a dense array of 5 floats (padded on the wire) and rows of two tables.
    fn reply() -> Vec<u8> {
        let dense = [vec![1.0f32, 2.0, 3.0, 4.0, 5.0]];
        let sparse = [vec![6.0f32, 7.0, 8.0], vec![9.0f32, 10.0, 11.0, 12.0]];
        encode_values(7, &dense, &sparse).to_vec()
    }

    /// A socket that hands out at most `piece` bytes a read.
    struct Trickle<'a> {
        bytes: &'a [u8],
        piece: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.piece).min(self.bytes.len());
            out[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    /// Reads `bytes`, `piece` bytes a read, with a placer taking the arrays `take` into `into`,
    /// returning what decoded.
    fn read_placing(
        bytes: &[u8],
        piece: usize,
        take: &[ValuesArray],
        into: &mut Vec<(ValuesArray, Vec<f32>)>,
    ) -> Response<'static> {
        let mut buf = FrameBuf::default();
        let mut place = |r: &mut dyn std::io::Read, which: ValuesArray, floats: usize| -> Result<bool, ProtocolError> {
            if !take.contains(&which) {
                return Ok(false);
            }
            let mut out = vec![0f32; floats];
            std::io::Read::read_exact(r, bytemuck::cast_slice_mut(&mut out))?;
            into.push((which, out));
            Ok(true)
        };
        let mut socket = Trickle { bytes, piece };
        let kind = read_reply_blocking(&mut socket, &mut buf, 1 << 20, &mut place).unwrap();
        assert!(socket.bytes.is_empty(), "the whole frame is read, no more");
        let decoded = Response::decode(kind, buf.payload()).unwrap();
        match decoded {
            Response::Values { version, dense, sparse } => Response::Values {
                version,
                dense: dense.into_owned().into(),
                sparse: sparse.into_iter().map(|s| s.into_owned().into()).collect(),
            },
            other => panic!("not values: {other:?}"),
        }
    }

    #[test]
    fn arrays_taken_by_the_placer_are_read_into_place_and_decode_empty() {
        let bytes = reply();
        // Whole, and in pieces that cut the fields and the arrays read ahead anywhere.
        for piece in [usize::MAX, 1, 3, 7, 13, 40, 64] {
            let mut placed = Vec::new();
            let got = read_placing(&bytes, piece, &[ValuesArray::Dense, ValuesArray::Rows(1)], &mut placed);
            assert_eq!(
                placed,
                vec![
                    (ValuesArray::Dense, vec![1.0, 2.0, 3.0, 4.0, 5.0]),
                    (ValuesArray::Rows(1), vec![9.0, 10.0, 11.0, 12.0])
                ],
                "{piece} bytes a read"
            );
            let Response::Values { version, dense, sparse } = got else { unreachable!() };
            assert_eq!((version, dense.len()), (7, 0));
            assert_eq!(sparse.iter().map(|s| s.to_vec()).collect::<Vec<_>>(), vec![vec![6.0, 7.0, 8.0], vec![]]);
        }
    }

    #[test]
    fn a_placer_that_takes_nothing_reads_the_frame_as_it_is() {
        let bytes = reply();
        let mut placed = Vec::new();
        let got = read_placing(&bytes, usize::MAX, &[], &mut placed);
        assert!(placed.is_empty());
        let mut buf = FrameBuf::default();
        let kind = read_frame_blocking(&mut &bytes[..], &mut buf, 1 << 20).unwrap();
        assert_eq!(got, Response::decode(kind, buf.payload()).unwrap());
    }

    #[test]
    fn counts_that_do_not_fit_the_frame_are_never_offered_and_are_refused() {
        let mut bytes = reply();
        // The second table's count (after the header, version, dense count and 5 padded
        // floats, the table count, the first table's count and its 3 padded floats) made huge.
        let at = 8 + 8 + 8 + 24 + 8 + 8 + 16;
        for count in [u64::MAX, u64::MAX / 4, 5] {
            bytes[at..at + 8].copy_from_slice(&count.to_le_bytes());
            let mut buf = FrameBuf::default();
            let mut offered = Vec::new();
            let mut place = |_: &mut dyn std::io::Read, which: ValuesArray, _: usize| -> Result<bool, ProtocolError> {
                offered.push(which);
                Ok(false)
            };
            let kind = read_reply_blocking(&mut &bytes[..], &mut buf, 1 << 20, &mut place).unwrap();
            assert_eq!(offered, vec![ValuesArray::Dense, ValuesArray::Rows(0)], "count {count}");
            assert!(Response::decode(kind, buf.payload()).is_err(), "count {count}");
        }
        // A huge count of tables stops at the frame's end; a frame cut short fails to read.
        let mut buf = FrameBuf::default();
        let mut tables = reply();
        tables[8 + 8 + 8 + 24..8 + 8 + 8 + 24 + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let kind = read_reply_blocking(&mut &tables[..], &mut buf, 1 << 20, &mut |_, _, _| Ok(false)).unwrap();
        assert!(Response::decode(kind, buf.payload()).is_err());
        let cut = &reply()[..40];
        assert!(read_reply_blocking(&mut &cut[..], &mut buf, 1 << 20, &mut |_, _, _| Ok(true)).is_err());
    }
}
