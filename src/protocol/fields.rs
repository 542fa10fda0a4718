//! The byte layer of the wire format: a [`Frame`] of 8-byte aligned fields that borrows its
//! message's large arrays for a vectored write ([`Encoder`]), and a [`Decoder`] that reads the
//! fields back, its arrays borrowed from the receive buffer. Which fields each message holds is
//! [`super::codec`]'s.

use std::borrow::Cow;
use std::io::IoSlice;

use super::{ProtocolError, HEADER};

/// Arrays shorter than this are copied into the frame's small-field buffer rather than
/// written from their own place: a separate write segment costs more than copying a few bytes.
const INLINE_BYTES: usize = 4096;

#[derive(Debug)]
enum Part<'a> {
    Small(usize, usize),
    Big(&'a [u8]),
}

/// An encoded frame: header and small fields in one buffer, large arrays borrowed from the
/// message, written together with vectored writes.
#[derive(Debug)]
pub struct Frame<'a> {
    small: Vec<u8>,
    parts: Vec<Part<'a>>,
    len: usize,
}

impl Frame<'_> {
    /// Total bytes, header included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a frame of no bytes (never produced by the encoders).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame's bytes in order, as slices for a vectored write.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Small(a, b) => IoSlice::new(&self.small[*a..*b]),
                Part::Big(s) => IoSlice::new(s),
            })
            .collect()
    }

    /// The frame as one byte vector (tests, and callers that need the bytes).
    pub fn to_vec(&self) -> Vec<u8> {
        self.io_slices().iter().flat_map(|s| s.iter().copied()).collect()
    }
}

/// Builds one frame (header included) field by field.
pub(super) struct Encoder<'a> {
    small: Vec<u8>,
    parts: Vec<Part<'a>>,
    run_start: usize,
    len: usize,
}

impl<'a> Encoder<'a> {
    pub(super) fn new(kind: u8) -> Encoder<'a> {
        let mut small = Vec::with_capacity(256);
        small.extend_from_slice(&[0, 0, 0, 0, kind, 0, 0, 0]);
        Encoder { small, parts: Vec::new(), run_start: 0, len: HEADER }
    }

    pub(super) fn raw(&mut self, b: &[u8]) {
        self.small.extend_from_slice(b);
        self.len += b.len();
    }

    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes());
        self
    }

    /// An f64 as its bits (the order of a u64's bytes).
    pub(super) fn f64(&mut self, v: f64) -> &mut Self {
        self.u64(v.to_bits())
    }

    pub(super) fn pad(&mut self, n: usize) {
        let pad = (8 - n % 8) % 8;
        self.raw(&[0u8; 8][..pad]);
    }

    /// Appends bytes that stay borrowed unless they are small.
    fn data(&mut self, b: &'a [u8]) {
        if b.len() < INLINE_BYTES {
            self.raw(b);
        } else {
            self.parts.push(Part::Small(self.run_start, self.small.len()));
            self.parts.push(Part::Big(b));
            self.run_start = self.small.len();
            self.len += b.len();
        }
    }

    pub(super) fn bytes(&mut self, b: &'a [u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.data(b);
        self.pad(b.len());
        self
    }

    pub(super) fn u64s(&mut self, v: &'a [u64]) -> &mut Self {
        self.u64(v.len() as u64);
        self.data(bytemuck::cast_slice(v));
        self
    }

    pub(super) fn f32s(&mut self, v: &'a [f32]) -> &mut Self {
        self.u64(v.len() as u64);
        self.data(bytemuck::cast_slice(v));
        self.pad(v.len() * 4);
        self
    }

    /// One array on the wire, made of consecutive chunks.
    pub(super) fn f32_chunks<S: AsRef<[f32]>>(&mut self, chunks: &'a [S]) -> &mut Self {
        let n: usize = chunks.iter().map(|c| c.as_ref().len()).sum();
        self.u64(n as u64);
        for c in chunks {
            self.data(bytemuck::cast_slice(c.as_ref()));
        }
        self.pad(n * 4);
        self
    }

    pub(super) fn finish(mut self) -> Frame<'a> {
        self.parts.push(Part::Small(self.run_start, self.small.len()));
        let payload = (self.len - HEADER) as u32;
        self.small[..4].copy_from_slice(&payload.to_le_bytes());
        Frame { small: self.small, parts: self.parts, len: self.len }
    }
}

/// Reads fields back from an 8-byte aligned payload.
pub(super) struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// Reads `payload` (a frame without its header) from its start.
    pub(super) fn new(payload: &'a [u8]) -> Decoder<'a> {
        Decoder { buf: payload, pos: 0 }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        let padded = n.div_ceil(8) * 8;
        if self.buf.len() - self.pos < padded {
            return Err(ProtocolError::Malformed(format!(
                "payload truncated: field of {n} bytes at offset {} of {}",
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += padded;
        Ok(s)
    }

    pub(super) fn u64(&mut self) -> Result<u64, ProtocolError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("take(8) returns 8 bytes")))
    }

    pub(super) fn f64(&mut self) -> Result<f64, ProtocolError> {
        Ok(f64::from_bits(self.u64()?))
    }

    pub(super) fn count(&mut self, elem: usize) -> Result<usize, ProtocolError> {
        let n = self.u64()?;
        let remaining = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(elem as u64) > remaining {
            return Err(ProtocolError::Malformed(format!("array of {n} elements does not fit in {remaining} bytes")));
        }
        Ok(n as usize)
    }

    pub(super) fn bytes(&mut self) -> Result<&'a [u8], ProtocolError> {
        let n = self.count(1)?;
        self.take(n)
    }

    pub(super) fn string(&mut self) -> Result<String, ProtocolError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::Malformed("string is not UTF-8".into()))
    }

    /// The array in place when aligned (always, for payloads read by [`read_frame`]), else a copy.
    pub(super) fn array<T: bytemuck::Pod>(&mut self) -> Result<Cow<'a, [T]>, ProtocolError> {
        let n = self.count(size_of::<T>())?;
        let b = self.take(n * size_of::<T>())?;
        Ok(match bytemuck::try_cast_slice::<u8, T>(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(b)),
        })
    }

    pub(super) fn end(&self) -> Result<(), ProtocolError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(ProtocolError::Malformed(format!("{} trailing bytes", self.buf.len() - self.pos)))
        }
    }
}
