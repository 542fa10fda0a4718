//! The trainer <-> server wire contract: messages, their binary encoding, and framing.
//!
//! A frame is an 8-byte header `[payload length: u32 LE][kind: u8][0u8; 3]` followed by the
//! payload. Every payload field is 8-byte aligned: scalars are u64, strings and arrays are a u64
//! count followed by raw little-endian bytes padded to 8. Nothing is encoded per element, and
//! nothing large is copied: a [`Frame`] borrows the message's arrays and is written with one
//! vectored write, and the receiver reads a payload into an 8-byte aligned buffer and decodes it
//! into messages that borrow their arrays from that buffer (`Cow::Borrowed`). Frames above the
//! receiver's maximum size are refused before their payload is read.
//!
//! A connection opens with [`Request::Hello`] (protocol version, job id, the client's view of the
//! cluster); the server answers [`Response::Welcome`] or an error and closes.

use std::borrow::Cow;
use std::io::IoSlice;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[cfg(target_endian = "big")]
compile_error!("oar's wire format maps little-endian arrays directly onto memory");

/// Version of this wire format; a server refuses clients of another version.
pub const PROTOCOL_VERSION: u64 = 1;
/// Magic number opening every Hello, so a stray client is recognized at once.
pub const MAGIC: u64 = u64::from_le_bytes(*b"oar-ps\0\0");
/// Default maximum payload size accepted by a receiver.
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;
const HEADER: usize = 8;

/// Errors of reading, writing and decoding frames.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection between frames.
    #[error("connection closed by peer")]
    Closed,
    /// A frame announced a payload above the limit.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced payload length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// The bytes do not form a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// What a pull asks for the dense part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseSelection {
    /// No dense values.
    None,
    /// All dense blocks this server owns.
    All,
}

/// Whether a pull may create absent sparse rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowCreation {
    /// Create absent rows (training).
    Create,
    /// Return initial values for absent rows without storing them (evaluation).
    Peek,
}

/// Ids of one sparse table.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseIds<'a> {
    /// Table index.
    pub table: u32,
    /// Feature ids, unique within a request.
    pub ids: Cow<'a, [u64]>,
}

/// Gradient sums for ids of one sparse table.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseGrads<'a> {
    /// Table index.
    pub table: u32,
    /// Feature ids, unique within a request.
    pub ids: Cow<'a, [u64]>,
    /// `dim` gradient floats per id.
    pub grads: Cow<'a, [f32]>,
}

impl SparseGrads<'_> {
    /// A copy that owns its arrays.
    pub fn into_owned(self) -> SparseGrads<'static> {
        SparseGrads {
            table: self.table,
            ids: Cow::Owned(self.ids.into_owned()),
            grads: Cow::Owned(self.grads.into_owned()),
        }
    }
}

/// The opening message of a connection.
#[derive(Clone, Debug, PartialEq)]
pub struct Hello {
    /// Must equal [`PROTOCOL_VERSION`].
    pub version: u64,
    /// Job id; a server serves one job.
    pub job: String,
    /// Number of servers the client routes over.
    pub num_servers: u64,
    /// Index the client believes this server has.
    pub server_index: u64,
}

/// A read of parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Pull<'a> {
    /// Dense part wanted.
    pub dense: DenseSelection,
    /// Row creation policy.
    pub create: RowCreation,
    /// Sparse ids wanted, per table.
    pub sparse: Vec<SparseIds<'a>>,
}

/// Gradients of one trainer step for the parameters this server owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Push<'a> {
    /// Trainer id.
    pub trainer: u64,
    /// The trainer's step number (0-based), the sync barrier's key.
    pub step: u64,
    /// The pass (1-based) the step belongs to.
    pub pass: u64,
    /// Server version the gradients were computed from (async staleness control).
    pub base_version: u64,
    /// Samples the gradient sums cover.
    pub samples: u64,
    /// Dense gradient sums for this server's blocks, as consecutive chunks (the blocks of the
    /// trainer's flat vector, sent without gathering them); empty: no dense gradient.
    pub dense: Vec<Cow<'a, [f32]>>,
    /// Sparse gradient sums per table.
    pub sparse: Vec<SparseGrads<'a>>,
}

impl Push<'_> {
    /// Number of dense floats.
    pub fn dense_len(&self) -> usize {
        self.dense.iter().map(|c| c.len()).sum()
    }

    /// The dense gradient as one slice (borrowed when it arrived in one piece).
    pub fn dense_contiguous(&self) -> Cow<'_, [f32]> {
        match &self.dense[..] {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            many => Cow::Owned(many.concat()),
        }
    }

    /// A copy that owns its arrays (the sync barrier keeps pushes beyond their frame).
    pub fn into_owned(self) -> Push<'static> {
        let dense = self.dense_contiguous().into_owned();
        Push {
            trainer: self.trainer,
            step: self.step,
            pass: self.pass,
            base_version: self.base_version,
            samples: self.samples,
            dense: if dense.is_empty() { vec![] } else { vec![Cow::Owned(dense)] },
            sparse: self.sparse.into_iter().map(SparseGrads::into_owned).collect(),
        }
    }
}

/// A client request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request<'a> {
    /// Open the connection.
    Hello(Hello),
    /// Create the tables from a spec, or check that the existing ones match it.
    Declare(crate::table::TableSpec),
    /// Read parameters.
    Pull(Pull<'a>),
    /// Apply gradients.
    Push(Push<'a>),
    /// Wait until every active trainer has reached `epoch`.
    Barrier {
        /// Trainer id.
        trainer: u64,
        /// Barrier number.
        epoch: u64,
    },
    /// The trainer has no more steps in `pass`: sync steps of this pass stop waiting for it.
    EndPass {
        /// Trainer id.
        trainer: u64,
        /// Pass number.
        pass: u64,
    },
    /// Write this server's shard into directory `dir`.
    Save {
        /// Checkpoint directory (on the server's file system).
        dir: String,
    },
    /// The trainer is done; the server forgets it.
    Close {
        /// Trainer id.
        trainer: u64,
    },
    /// Ask for the server's counters.
    Stats,
}

/// Outcome of an async push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushOutcome {
    /// The gradients were applied.
    Applied,
    /// The gradients were too stale and were dropped.
    Discarded,
}

/// Why a server refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum ErrorCode {
    /// The frame could not be decoded.
    Malformed = 1,
    /// The frame exceeded the maximum size.
    TooLarge = 2,
    /// Handshake mismatch (version, job, cluster layout).
    Handshake = 3,
    /// The request does not fit the tables (unknown table, wrong lengths, spec mismatch).
    Table = 4,
    /// A barrier or sync step timed out.
    Timeout = 5,
    /// The server could not read or write a file.
    Io = 6,
    /// The request is not valid in this state (e.g. before Hello or Declare).
    State = 7,
}

impl ErrorCode {
    fn from_u64(v: u64) -> Result<ErrorCode, ProtocolError> {
        use ErrorCode::*;
        Ok(match v {
            1 => Malformed,
            2 => TooLarge,
            3 => Handshake,
            4 => Table,
            5 => Timeout,
            6 => Io,
            7 => State,
            _ => return Err(ProtocolError::Malformed(format!("unknown error code {v}"))),
        })
    }
}

/// A server response.
#[derive(Clone, Debug, PartialEq)]
pub enum Response<'a> {
    /// Handshake accepted.
    Welcome {
        /// The server's index.
        server_index: u64,
        /// Number of servers in the job.
        num_servers: u64,
    },
    /// The request succeeded and has nothing to return.
    Done,
    /// Pulled values.
    Values {
        /// Server version (number of applied updates) the values belong to.
        version: u64,
        /// Dense values of this server's blocks (empty if not asked).
        dense: Cow<'a, [f32]>,
        /// Rows per requested table, `dim` floats per id.
        sparse: Vec<Cow<'a, [f32]>>,
    },
    /// Push result.
    Pushed {
        /// Applied or discarded.
        outcome: PushOutcome,
        /// Server version after the push.
        version: u64,
    },
    /// A shard file was written.
    Saved {
        /// File name inside the checkpoint directory.
        file: String,
        /// Size in bytes.
        bytes: u64,
        /// CRC-32 of the file's content.
        crc32: u32,
    },
    /// Counters as JSON.
    Stats(String),
    /// The request failed.
    Error {
        /// Category.
        code: ErrorCode,
        /// Human-readable reason.
        message: String,
    },
}

mod kind {
    pub const HELLO: u8 = 1;
    pub const DECLARE: u8 = 2;
    pub const PULL: u8 = 3;
    pub const PUSH: u8 = 4;
    pub const BARRIER: u8 = 5;
    pub const SAVE: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const STATS: u8 = 8;
    pub const END_PASS: u8 = 9;
    pub const WELCOME: u8 = 101;
    pub const DONE: u8 = 102;
    pub const VALUES: u8 = 103;
    pub const PUSHED: u8 = 104;
    pub const SAVED: u8 = 105;
    pub const STATS_REPLY: u8 = 106;
    pub const ERROR: u8 = 107;
}

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

    /// The kind byte.
    pub fn kind(&self) -> u8 {
        self.small[4]
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
struct Encoder<'a> {
    small: Vec<u8>,
    parts: Vec<Part<'a>>,
    run_start: usize,
    len: usize,
}

impl<'a> Encoder<'a> {
    fn new(kind: u8) -> Encoder<'a> {
        let mut small = Vec::with_capacity(256);
        small.extend_from_slice(&[0, 0, 0, 0, kind, 0, 0, 0]);
        Encoder { small, parts: Vec::new(), run_start: 0, len: HEADER }
    }

    fn raw(&mut self, b: &[u8]) {
        self.small.extend_from_slice(b);
        self.len += b.len();
    }

    fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes());
        self
    }

    fn pad(&mut self, n: usize) {
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

    fn bytes(&mut self, b: &'a [u8]) -> &mut Self {
        self.u64(b.len() as u64);
        self.data(b);
        self.pad(b.len());
        self
    }

    fn u64s(&mut self, v: &'a [u64]) -> &mut Self {
        self.u64(v.len() as u64);
        self.data(bytemuck::cast_slice(v));
        self
    }

    fn f32s(&mut self, v: &'a [f32]) -> &mut Self {
        self.u64(v.len() as u64);
        self.data(bytemuck::cast_slice(v));
        self.pad(v.len() * 4);
        self
    }

    /// One array on the wire, made of consecutive chunks.
    fn f32_chunks<S: AsRef<[f32]>>(&mut self, chunks: &'a [S]) -> &mut Self {
        let n: usize = chunks.iter().map(|c| c.as_ref().len()).sum();
        self.u64(n as u64);
        for c in chunks {
            self.data(bytemuck::cast_slice(c.as_ref()));
        }
        self.pad(n * 4);
        self
    }

    fn finish(mut self) -> Frame<'a> {
        self.parts.push(Part::Small(self.run_start, self.small.len()));
        let payload = (self.len - HEADER) as u32;
        self.small[..4].copy_from_slice(&payload.to_le_bytes());
        Frame { small: self.small, parts: self.parts, len: self.len }
    }
}

/// Reads fields back from an 8-byte aligned payload.
struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
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

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("take(8) returns 8 bytes")))
    }

    fn count(&mut self, elem: usize) -> Result<usize, ProtocolError> {
        let n = self.u64()?;
        let remaining = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(elem as u64) > remaining {
            return Err(ProtocolError::Malformed(format!("array of {n} elements does not fit in {remaining} bytes")));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtocolError> {
        let n = self.count(1)?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, ProtocolError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtocolError::Malformed("string is not UTF-8".into()))
    }

    /// The array in place when aligned (always, for payloads read by [`read_frame`]), else a copy.
    fn array<T: bytemuck::Pod>(&mut self) -> Result<Cow<'a, [T]>, ProtocolError> {
        let n = self.count(size_of::<T>())?;
        let b = self.take(n * size_of::<T>())?;
        Ok(match bytemuck::try_cast_slice::<u8, T>(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(b)),
        })
    }

    fn end(&self) -> Result<(), ProtocolError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(ProtocolError::Malformed(format!("{} trailing bytes", self.buf.len() - self.pos)))
        }
    }
}

fn enum_field<T>(v: u64, values: &[T], what: &str) -> Result<T, ProtocolError>
where
    T: Copy,
{
    values.get(v as usize).copied().ok_or_else(|| ProtocolError::Malformed(format!("invalid {what} {v}")))
}

impl<'a> Request<'a> {
    /// Encodes the request as one frame, header included, borrowing its arrays.
    pub fn encode(&self) -> Frame<'_> {
        match self {
            Request::Hello(h) => {
                let mut e = Encoder::new(kind::HELLO);
                e.u64(MAGIC).u64(h.version).u64(h.num_servers).u64(h.server_index).bytes(h.job.as_bytes());
                e.finish()
            }
            Request::Declare(spec) => {
                let json = serde_json::to_vec(spec).expect("a TableSpec always serializes");
                let mut e = Encoder::new(kind::DECLARE);
                e.u64(json.len() as u64);
                e.raw(&json);
                e.pad(json.len());
                e.finish()
            }
            Request::Pull(p) => {
                let mut e = Encoder::new(kind::PULL);
                e.u64(p.dense as u64).u64(p.create as u64).u64(p.sparse.len() as u64);
                for s in &p.sparse {
                    e.u64(s.table as u64).u64s(&s.ids);
                }
                e.finish()
            }
            Request::Push(p) => {
                let mut e = Encoder::new(kind::PUSH);
                e.u64(p.trainer).u64(p.step).u64(p.pass).u64(p.base_version).u64(p.samples).f32_chunks(&p.dense);
                e.u64(p.sparse.len() as u64);
                for s in &p.sparse {
                    e.u64(s.table as u64).u64s(&s.ids).f32s(&s.grads);
                }
                e.finish()
            }
            Request::Barrier { trainer, epoch } => {
                let mut e = Encoder::new(kind::BARRIER);
                e.u64(*trainer).u64(*epoch);
                e.finish()
            }
            Request::EndPass { trainer, pass } => {
                let mut e = Encoder::new(kind::END_PASS);
                e.u64(*trainer).u64(*pass);
                e.finish()
            }
            Request::Save { dir } => {
                let mut e = Encoder::new(kind::SAVE);
                e.bytes(dir.as_bytes());
                e.finish()
            }
            Request::Close { trainer } => {
                let mut e = Encoder::new(kind::CLOSE);
                e.u64(*trainer);
                e.finish()
            }
            Request::Stats => Encoder::new(kind::STATS).finish(),
        }
    }

    /// Decodes a request from a frame's kind and aligned payload; arrays borrow from `payload`.
    pub fn decode(kind: u8, payload: &'a [u8]) -> Result<Request<'a>, ProtocolError> {
        let mut d = Decoder { buf: payload, pos: 0 };
        let req = match kind {
            kind::HELLO => {
                if d.u64()? != MAGIC {
                    return Err(ProtocolError::Malformed("bad magic: not an oar client".into()));
                }
                let version = d.u64()?;
                let num_servers = d.u64()?;
                let server_index = d.u64()?;
                let job = d.string()?;
                Request::Hello(Hello { version, job, num_servers, server_index })
            }
            kind::DECLARE => {
                let json = d.bytes()?;
                let spec =
                    serde_json::from_slice(json).map_err(|e| ProtocolError::Malformed(format!("table spec: {e}")))?;
                Request::Declare(spec)
            }
            kind::PULL => {
                let dense = enum_field(d.u64()?, &[DenseSelection::None, DenseSelection::All], "dense selection")?;
                let create = enum_field(d.u64()?, &[RowCreation::Create, RowCreation::Peek], "row creation")?;
                let n = d.count(16)?;
                let mut sparse = Vec::with_capacity(n);
                for _ in 0..n {
                    let table = table_index(d.u64()?)?;
                    sparse.push(SparseIds { table, ids: d.array()? });
                }
                Request::Pull(Pull { dense, create, sparse })
            }
            kind::PUSH => {
                let trainer = d.u64()?;
                let step = d.u64()?;
                let pass = d.u64()?;
                let base_version = d.u64()?;
                let samples = d.u64()?;
                let dense: Cow<'a, [f32]> = d.array()?;
                let dense = if dense.is_empty() { vec![] } else { vec![dense] };
                let n = d.count(24)?;
                let mut sparse = Vec::with_capacity(n);
                for _ in 0..n {
                    let table = table_index(d.u64()?)?;
                    let ids = d.array()?;
                    let grads = d.array()?;
                    sparse.push(SparseGrads { table, ids, grads });
                }
                Request::Push(Push { trainer, step, pass, base_version, samples, dense, sparse })
            }
            kind::BARRIER => Request::Barrier { trainer: d.u64()?, epoch: d.u64()? },
            kind::END_PASS => Request::EndPass { trainer: d.u64()?, pass: d.u64()? },
            kind::SAVE => Request::Save { dir: d.string()? },
            kind::CLOSE => Request::Close { trainer: d.u64()? },
            kind::STATS => Request::Stats,
            other => return Err(ProtocolError::Malformed(format!("unknown request kind {other}"))),
        };
        d.end()?;
        Ok(req)
    }
}

/// Encodes a `Values` response whose dense array is made of consecutive chunks (a server's
/// blocks, sent from where they lie).
pub fn encode_values<'a, D: AsRef<[f32]>, S: AsRef<[f32]>>(version: u64, dense: &'a [D], sparse: &'a [S]) -> Frame<'a> {
    let mut e = Encoder::new(kind::VALUES);
    e.u64(version).f32_chunks(dense).u64(sparse.len() as u64);
    for rows in sparse {
        e.f32s(rows.as_ref());
    }
    e.finish()
}

fn table_index(v: u64) -> Result<u32, ProtocolError> {
    u32::try_from(v).map_err(|_| ProtocolError::Malformed(format!("table index {v} out of range")))
}

impl<'a> Response<'a> {
    /// Encodes the response as one frame, header included, borrowing its arrays.
    pub fn encode(&self) -> Frame<'_> {
        match self {
            Response::Welcome { server_index, num_servers } => {
                let mut e = Encoder::new(kind::WELCOME);
                e.u64(*server_index).u64(*num_servers);
                e.finish()
            }
            Response::Done => Encoder::new(kind::DONE).finish(),
            Response::Values { version, dense, sparse } => encode_values(*version, std::slice::from_ref(dense), sparse),
            Response::Pushed { outcome, version } => {
                let mut e = Encoder::new(kind::PUSHED);
                e.u64(*outcome as u64).u64(*version);
                e.finish()
            }
            Response::Saved { file, bytes, crc32 } => {
                let mut e = Encoder::new(kind::SAVED);
                e.bytes(file.as_bytes()).u64(*bytes).u64(*crc32 as u64);
                e.finish()
            }
            Response::Stats(json) => {
                let mut e = Encoder::new(kind::STATS_REPLY);
                e.bytes(json.as_bytes());
                e.finish()
            }
            Response::Error { code, message } => {
                let mut e = Encoder::new(kind::ERROR);
                e.u64(*code as u64).bytes(message.as_bytes());
                e.finish()
            }
        }
    }

    /// Decodes a response from a frame's kind and aligned payload; arrays borrow from `payload`.
    pub fn decode(kind: u8, payload: &'a [u8]) -> Result<Response<'a>, ProtocolError> {
        let mut d = Decoder { buf: payload, pos: 0 };
        let resp = match kind {
            kind::WELCOME => Response::Welcome { server_index: d.u64()?, num_servers: d.u64()? },
            kind::DONE => Response::Done,
            kind::VALUES => {
                let version = d.u64()?;
                let dense = d.array()?;
                let n = d.count(8)?;
                let sparse = (0..n).map(|_| d.array()).collect::<Result<_, _>>()?;
                Response::Values { version, dense, sparse }
            }
            kind::PUSHED => {
                let outcome = enum_field(d.u64()?, &[PushOutcome::Applied, PushOutcome::Discarded], "push outcome")?;
                Response::Pushed { outcome, version: d.u64()? }
            }
            kind::SAVED => {
                let file = d.string()?;
                let bytes = d.u64()?;
                let crc32 =
                    u32::try_from(d.u64()?).map_err(|_| ProtocolError::Malformed("crc32 out of range".into()))?;
                Response::Saved { file, bytes, crc32 }
            }
            kind::STATS_REPLY => Response::Stats(d.string()?),
            kind::ERROR => Response::Error { code: ErrorCode::from_u64(d.u64()?)?, message: d.string()? },
            other => return Err(ProtocolError::Malformed(format!("unknown response kind {other}"))),
        };
        d.end()?;
        Ok(resp)
    }
}

/// A reusable, 8-byte aligned receive buffer.
#[derive(Default)]
pub struct FrameBuf {
    words: Vec<u64>,
    len: usize,
}

impl FrameBuf {
    /// The payload of the last frame read.
    pub fn payload(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// Checks a frame header and returns (payload length, kind).
fn parse_header(header: &[u8; HEADER], max: usize) -> Result<(usize, u8), ProtocolError> {
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    if header[5..] != [0, 0, 0] {
        return Err(ProtocolError::Malformed("reserved header bytes are not zero".into()));
    }
    if len > max {
        return Err(ProtocolError::TooLarge { len, max });
    }
    Ok((len, header[4]))
}

impl FrameBuf {
    /// Resizes for a payload of `len` bytes and returns the bytes to fill.
    fn prepare(&mut self, len: usize) -> &mut [u8] {
        // Grown, never shrunk or re-zeroed: the bytes are overwritten by the read.
        let words = len.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        self.len = len;
        &mut bytemuck::cast_slice_mut(&mut self.words)[..len]
    }
}

/// Reads one frame into `buf` and returns its kind; `Err(Closed)` if the peer closed cleanly
/// between frames. A payload above `max` is refused before it is read.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut FrameBuf, max: usize) -> Result<u8, ProtocolError> {
    let mut header = [0u8; HEADER];
    let first = r.read(&mut header).await?;
    if first == 0 {
        return Err(ProtocolError::Closed);
    }
    r.read_exact(&mut header[first..]).await?;
    let (len, kind) = parse_header(&header, max)?;
    r.read_exact(buf.prepare(len)).await?;
    Ok(kind)
}

/// Blocking twin of [`read_frame`], for the trainer's client.
pub fn read_frame_blocking<R: std::io::Read>(r: &mut R, buf: &mut FrameBuf, max: usize) -> Result<u8, ProtocolError> {
    read_reply_blocking(r, buf, max, &mut |_, _| Ok(false))
}

/// Reads one frame like [`read_frame_blocking`], except that the dense array of a `Values`
/// response is handed to `dense_into(reader, floats)`, which may read it straight into its
/// final place (returning true) instead of through the buffer. The buffer then holds a `Values`
/// payload with an empty dense array, so [`Response::decode`] still applies.
pub fn read_reply_blocking<R: std::io::Read>(
    r: &mut R,
    buf: &mut FrameBuf,
    max: usize,
    dense_into: &mut dyn FnMut(&mut R, usize) -> Result<bool, ProtocolError>,
) -> Result<u8, ProtocolError> {
    let mut header = [0u8; HEADER];
    let first = r.read(&mut header)?;
    if first == 0 {
        return Err(ProtocolError::Closed);
    }
    r.read_exact(&mut header[first..])?;
    let (len, kind) = parse_header(&header, max)?;
    if kind == kind::VALUES && len >= 16 {
        let mut fixed = [0u8; 16];
        r.read_exact(&mut fixed)?;
        let floats = u64::from_le_bytes(fixed[8..].try_into().expect("8 bytes"));
        let dense_bytes = floats.checked_mul(4).map(|b| b.div_ceil(8) * 8).filter(|&b| b <= (len - 16) as u64);
        let Some(dense_bytes) = dense_bytes else {
            return Err(ProtocolError::Malformed(format!("dense array of {floats} floats does not fit")));
        };
        let streamed = floats > 0 && dense_into(r, floats as usize)?;
        if streamed {
            if floats % 2 == 1 {
                r.read_exact(&mut [0u8; 4])?;
            }
            let rest = len - 16 - dense_bytes as usize;
            let out = buf.prepare(16 + rest);
            out[..8].copy_from_slice(&fixed[..8]);
            out[8..16].fill(0);
            r.read_exact(&mut out[16..])?;
        } else {
            let out = buf.prepare(len);
            out[..16].copy_from_slice(&fixed);
            r.read_exact(&mut out[16..])?;
        }
        return Ok(kind);
    }
    r.read_exact(buf.prepare(len))?;
    Ok(kind)
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
    Ok(())
}

/// Splits an encoded frame into kind and payload, copying the payload into an aligned buffer
/// (used by tests and in-process callers that have the bytes already).
pub fn split_frame(frame: &[u8]) -> (u8, FrameBuf) {
    let payload = &frame[HEADER..];
    let mut buf = FrameBuf { words: vec![0; payload.len().div_ceil(8)], len: payload.len() };
    bytemuck::cast_slice_mut::<u64, u8>(&mut buf.words)[..payload.len()].copy_from_slice(payload);
    (frame[4], buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{DenseParam, DenseSpec, Init, Optimizer, TableSpec};

    fn round_trip_request(r: Request) {
        let frame = r.encode().to_vec();
        let (kind, buf) = split_frame(&frame);
        assert_eq!(Request::decode(kind, buf.payload()).unwrap(), r);
    }

    fn round_trip_response(r: Response) {
        let frame = r.encode().to_vec();
        let (kind, buf) = split_frame(&frame);
        assert_eq!(Response::decode(kind, buf.payload()).unwrap(), r);
    }

    #[test]
    fn every_request_round_trips() {
        round_trip_request(Request::Hello(Hello { version: 1, job: "job-é".into(), num_servers: 3, server_index: 2 }));
        round_trip_request(Request::Declare(TableSpec {
            dense: DenseSpec {
                params: vec![DenseParam { name: "w".into(), len: 5, init: Init::Uniform { scale: 0.1 } }],
                block_size: 8,
                seed: 1,
                optimizer: Optimizer::adam(1e-3),
            },
            sparse: vec![],
        }));
        round_trip_request(Request::Pull(Pull {
            dense: DenseSelection::All,
            create: RowCreation::Peek,
            sparse: vec![
                SparseIds { table: 0, ids: vec![1, u64::MAX].into() },
                SparseIds { table: 1, ids: vec![].into() },
            ],
        }));
        round_trip_request(Request::Push(Push {
            trainer: 1,
            step: 7,
            pass: 2,
            base_version: 3,
            samples: 512,
            dense: vec![vec![1.0, 2.0, 3.0].into()],
            sparse: vec![SparseGrads { table: 0, ids: vec![9].into(), grads: vec![0.5; 3].into() }],
        }));
        round_trip_request(Request::Barrier { trainer: 1, epoch: 2 });
        round_trip_request(Request::EndPass { trainer: 1, pass: 3 });
        round_trip_request(Request::Save { dir: "/tmp/x".into() });
        round_trip_request(Request::Close { trainer: 3 });
        round_trip_request(Request::Stats);
    }

    #[test]
    fn every_response_round_trips() {
        round_trip_response(Response::Welcome { server_index: 1, num_servers: 2 });
        round_trip_response(Response::Done);
        round_trip_response(Response::Values {
            version: 4,
            dense: vec![1.5; 3].into(),
            sparse: vec![vec![2.0; 5].into(), vec![].into()],
        });
        round_trip_response(Response::Pushed { outcome: PushOutcome::Discarded, version: 9 });
        round_trip_response(Response::Saved { file: "server-0.shard".into(), bytes: 10, crc32: 0xdead_beef });
        round_trip_response(Response::Stats("{}".into()));
        round_trip_response(Response::Error { code: ErrorCode::Timeout, message: "trainer 1 missing".into() });
    }

    #[test]
    fn truncated_and_lying_payloads_are_malformed() {
        let frame = Request::Push(Push {
            trainer: 0,
            step: 0,
            pass: 1,
            base_version: 0,
            samples: 1,
            dense: vec![vec![1.0; 10].into()],
            sparse: vec![],
        })
        .encode()
        .to_vec();
        let (kind, buf) = split_frame(&frame[..frame.len() - 8]);
        assert!(matches!(Request::decode(kind, buf.payload()), Err(ProtocolError::Malformed(_))));
        // A count claiming more elements than the payload holds is refused before allocating.
        let mut lying = frame.clone();
        lying[8 + 40..8 + 48].copy_from_slice(&u64::MAX.to_le_bytes());
        let (kind, buf) = split_frame(&lying);
        assert!(matches!(Request::decode(kind, buf.payload()), Err(ProtocolError::Malformed(_))));
        assert!(matches!(Request::decode(200, &[]), Err(ProtocolError::Malformed(_))));
    }

    #[tokio::test]
    async fn oversized_frames_are_refused_before_reading() {
        let frame = Request::Push(Push {
            trainer: 0,
            step: 0,
            pass: 1,
            base_version: 0,
            samples: 1,
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
}
