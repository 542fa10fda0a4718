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
//! A connection opens with [`Request::Hello`] (magic, protocol version, job id, the client's view
//! of the cluster, the trainer it belongs to, the newest epoch of the server it has met); the
//! server answers [`Response::Welcome`] or an error and closes. Errors carry a typed code
//! ([`ErrorCode`]).
//!
//! Why our own framing: `../shared/research/deps.md` measured raw tokio framing at loopback line
//! rate where tonic and tarpc reached 20-50% of it, and zero copies need control of the layout:
//! arrays 8-byte aligned in the payload so the receiver decodes them in place (`bytemuck`),
//! frames written with vectored writes straight from the caller's slices. The server reads
//! frames with tokio, the trainer with blocking `std::net` sockets (`io.rs`'s two halves).

pub mod auth;
mod codec;
mod fields;
mod io;
mod placed;
mod saves;
pub mod terms;

use std::borrow::Cow;

pub use codec::encode_values;
pub use fields::Frame;
pub use io::{read_frame, read_frame_blocking, split_frame, write_frame, write_frame_blocking, BufferBudget, FrameBuf};
pub use placed::{read_reply_blocking, Placer, ValuesArray};
pub use saves::{ExportKind, Exported};
pub use terms::{Mode, NonFinite, ServerStats, MAX_SAMPLES};

#[cfg(target_endian = "big")]
compile_error!("oar's wire format maps little-endian arrays directly onto memory");

/// Version of this wire format; a server refuses clients of another version.
pub const PROTOCOL_VERSION: u64 = 11;
/// Magic number opening every Hello, so a stray client is recognized at once.
pub const MAGIC: u64 = u64::from_le_bytes(*b"oar-ps\0\0");
/// Default maximum payload size accepted by a receiver.
pub const DEFAULT_MAX_FRAME: usize = 256 << 20;
/// Bytes of a frame header.
const HEADER: usize = 8;
/// Bytes of a frame's header (its length and kind).
pub const HEADER_BYTES: u64 = HEADER as u64;

/// Errors of reading, writing and decoding frames.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error(transparent)]
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
    /// A frame would take the receive buffers past their budget: all connections' together, or
    /// those of one peer (a trainer, or the tools and operators together).
    #[error(
        "frame of {len} bytes refused: the receive buffers of this server's connections, or this peer's share of \
         them, hold {held} of the {most} bytes they may (--max-receive-mb)"
    )]
    OverBudget {
        /// Announced payload length.
        len: usize,
        /// Bytes held by every connection's buffer.
        held: usize,
        /// The budget.
        most: usize,
    },
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
    /// Return zeros for absent rows without storing them (evaluation, prediction, export: an
    /// unknown id contributes nothing, as in a serving key-value store).
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
    /// Shows and clicks per id (2 floats each): the row statistics (see
    /// [`crate::table::accessor`]).
    pub counts: Cow<'a, [f32]>,
    /// `dim` gradient floats per id.
    pub grads: Cow<'a, [f32]>,
}

impl SparseGrads<'_> {
    /// A copy that owns its arrays.
    pub fn into_owned(self) -> SparseGrads<'static> {
        SparseGrads {
            table: self.table,
            ids: Cow::Owned(self.ids.into_owned()),
            counts: Cow::Owned(self.counts.into_owned()),
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
    /// The trainer this connection belongs to, or [`NOT_A_TRAINER`] (benchmarks, tools): servers
    /// use it to name trainers that never arrived.
    pub trainer: u64,
    /// The newest epoch (incarnation) of this server the client has met, 0 at first: a server
    /// of an older epoch has been replaced, and refuses the client and stops.
    pub epoch: u64,
}

/// [`Hello::trainer`] of a client that is not one of the job's trainers.
pub const NOT_A_TRAINER: u64 = u64::MAX;

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

/// Which part of a trainer step a push carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushPart {
    /// Dense and sparse gradients together.
    Whole,
    /// Only the dense gradients; the sparse half comes on a sparse port. Counts as the update.
    Dense,
    /// Only the sparse gradients.
    Sparse,
}

/// How an async server applies a push (a sync server merges every push).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Apply {
    /// At once, with the optimizer's own step.
    #[default]
    Now,
    /// Merged with every active trainer's push of the same step into one update, answered once
    /// it is applied: async mode's synchronous warm-up.
    Merged,
    /// At once, the dense step (the learning rate) divided by the push's staleness when that is
    /// above 1: a push computed from parameters `k` updates old moves the weights `1/k` as far.
    StalenessScaled,
    /// The rows at once, the dense part merged with every active trainer's push of the same
    /// step into one update, answered once that is applied: async mode's `sync_dense` (dense
    /// parameters synchronous among trainers, rows asynchronous). Never split in halves.
    DenseMerged,
}

impl Apply {
    /// The factor on the dense learning rate for a push `staleness` updates old.
    pub fn dense_lr_factor(self, staleness: u64) -> f32 {
        match self {
            Apply::StalenessScaled if staleness > 1 => 1.0 / staleness as f32,
            _ => 1.0,
        }
    }
}

/// Gradients of one trainer step for the parameters this server owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Push<'a> {
    /// Trainer id.
    pub trainer: u64,
    /// The trainer's own step count (0-based), for messages; sync servers number steps
    /// themselves, since trainers with uneven data push different numbers of steps.
    pub step: u64,
    /// The pass (1-based) the step belongs to.
    pub pass: u64,
    /// Server version the gradients were computed from (async staleness control).
    pub base_version: u64,
    /// Samples the gradient sums cover.
    pub samples: u64,
    /// Whether this message is a whole step or one half of a step split over a general and a
    /// sparse-only port (`--ports_num_for_sparse`).
    pub part: PushPart,
    /// How an async server applies it.
    pub apply: Apply,
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
            part: self.part,
            apply: self.apply,
            dense: if dense.is_empty() { vec![] } else { vec![Cow::Owned(dense)] },
            sparse: self.sparse.into_iter().map(SparseGrads::into_owned).collect(),
        }
    }
}

/// The tables a trainer's model needs, and what the model is (kept by servers for the
/// manifest of the model they save when every trainer has closed).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Declaration {
    /// The tables.
    pub spec: crate::table::TableSpec,
    /// The model and data description written into manifests (opaque to servers).
    #[serde(default)]
    pub model: serde_json::Value,
    /// An online job's calendar as this trainer listed it (empty otherwise): servers keep the
    /// first trainer's and refuse another ([`ListedDay::first_difference`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calendar: Vec<ListedDay>,
}

/// One day of an online job's calendar as a trainer listed it. Every trainer must list the same
/// files: each pass's split of a day is dealt from them by position, so a file one trainer saw
/// and another did not (added between their starts) shifted the splits, and files went
/// untrained without a word.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListedDay {
    /// The date, `YYYYMMDD`.
    pub day: String,
    /// Files listed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// SHA-256 (hex) of their names and sizes in order.
    pub digest: String,
}

impl ListedDay {
    /// How `mine` differs from the calendar `kept` (the first trainer's), naming the first day
    /// that differs, or `None` when they are the same.
    pub fn first_difference(kept: &[ListedDay], mine: &[ListedDay]) -> Option<String> {
        if kept == mine {
            return None;
        }
        let why = match kept.iter().zip(mine).find(|(a, b)| a != b) {
            Some((a, b)) => format!(
                "day {}: {} files of {} bytes here, {} files of {} bytes for the trainer that declared first{}",
                b.day,
                b.files,
                b.bytes,
                a.files,
                a.bytes,
                if (a.files, a.bytes) == (b.files, b.bytes) { " (other names)" } else { "" }
            ),
            None => format!("{} days here, {} for the trainer that declared first", mine.len(), kept.len()),
        };
        Some(format!(
            "the online calendar differs from the other trainers': {why}: every trainer must list the same files \
             (was a file added or removed after the job started?)"
        ))
    }
}

/// A client request.
#[derive(Clone, Debug, PartialEq)]
pub enum Request<'a> {
    /// Open the connection.
    Hello(Hello),
    /// Create the tables from a spec, or check that the existing ones match it.
    Declare(Declaration),
    /// Read parameters.
    Pull(Pull<'a>),
    /// Apply gradients.
    Push(Push<'a>),
    /// The trainer's push of `step` reached every server: a sync step may now apply it. A
    /// server of several holds a sync push until its commit (the server's sync step), so a
    /// step is applied everywhere or nowhere.
    Commit {
        /// Trainer id.
        trainer: u64,
        /// The trainer's step number of the push.
        step: u64,
    },
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
    /// Trainer `trainer`'s histogram of its pass-`pass` training predictions (Paddle's AUC
    /// buckets, [`crate::observe::metrics::AucBuckets`]), for server 0 to merge with the others'.
    PassAuc {
        /// Trainer id.
        trainer: u64,
        /// Pass number.
        pass: u64,
        /// Positive samples per bucket.
        pos: Cow<'a, [u64]>,
        /// Negative samples per bucket.
        neg: Cow<'a, [u64]>,
        /// The error sums ([`crate::observe::metrics::AucBuckets::sums`]).
        sums: [f64; 3],
    },
    /// Ask server 0 for pass `pass`'s histograms merged over the trainers that sent one,
    /// answered as `Stats` JSON ([`GlobalAuc`]).
    GlobalAuc {
        /// Pass number.
        pass: u64,
    },
    /// Shrink every sparse table (decay the statistics, delete rows by score or unseen days)
    /// after `days` more days; answered as `Stats` JSON ([`Shrunk`]).
    Shrink {
        /// Days passed since the last shrink that counted days (0: within the day).
        days: u64,
        /// The pass whose end this shrink is (an online day's last pass): a server applies
        /// each day end once, answering a shrink for a day end it has applied already (sent
        /// again by a restarted trainer or after a restart of the server) as a repeat. 0 for
        /// an operator's shrink (`oar shrink`), applied every time.
        day_end: u64,
    },
    /// Write this server's base or delta save into `dir` (the `export` module); answered as
    /// `Stats` JSON ([`Exported`]).
    Export {
        /// The save's folder (on the server's file system, inside its save root).
        dir: String,
        /// Base or delta.
        kind: ExportKind,
    },
    /// GEO mode: the ids of the rows this server's tables changed (by any trainer's push)
    /// since `trainer` last asked, answered [`Response::Changed`]: what the trainer pulls back.
    Changed {
        /// Trainer id.
        trainer: u64,
    },
}

/// What a shrink did on one server, per sparse table.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shrunk {
    /// Rows deleted.
    pub deleted: Vec<u64>,
    /// Rows left.
    pub rows: Vec<u64>,
    /// The day end had been applied already: nothing was done this time.
    #[serde(default)]
    pub repeat: bool,
}

/// A pass's training AUC over every trainer's samples: the trainers whose histograms server 0
/// merged, and the merged histogram.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GlobalAuc {
    /// Trainers that sent their histogram of the pass.
    pub trainers: Vec<u64>,
    /// Their histograms added up.
    pub buckets: crate::observe::metrics::AucBuckets,
}

impl Request<'_> {
    /// What the request is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello(_) => "a Hello",
            Request::Declare(_) => "a declaration",
            Request::Pull(_) => "a pull",
            Request::Push(_) => "a push",
            Request::Commit { .. } => "a commit",
            Request::Barrier { .. } => "a barrier",
            Request::EndPass { .. } => "a pass end",
            Request::Save { .. } => "a save",
            Request::Close { .. } => "a close",
            Request::Stats => "a stats request",
            Request::PassAuc { .. } => "a pass AUC histogram",
            Request::GlobalAuc { .. } => "a global AUC request",
            Request::Shrink { .. } => "a shrink",
            Request::Export { .. } => "a base or delta save",
            Request::Changed { .. } => "a request for the rows changed",
        }
    }
}

/// Outcome of a push or a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushOutcome {
    /// The gradients were applied.
    Applied,
    /// The gradients were too stale and were dropped.
    Discarded,
    /// A sync push is held until the trainer commits it ([`Request::Commit`]).
    Held,
    /// A commit found no push of that step held (a server restarted from a checkpoint since):
    /// the trainer sends the push again.
    NotHeld,
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
    /// The server has been replaced by a newer epoch of itself; it stops.
    Fenced = 8,
    /// A push held a NaN, an infinity or a value beyond ±1e18: refused before it touched a table.
    NonFinite = 9,
    /// The server has as many connections as it takes (`--max-connections`).
    Busy = 10,
}

impl ErrorCode {
    pub(crate) fn from_u64(v: u64) -> Result<ErrorCode, ProtocolError> {
        use ErrorCode::*;
        Ok(match v {
            1 => Malformed,
            2 => TooLarge,
            3 => Handshake,
            4 => Table,
            5 => Timeout,
            6 => Io,
            7 => State,
            8 => Fenced,
            9 => NonFinite,
            10 => Busy,
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
        /// The server's epoch: 0 for the first process to hold its place, one more for each
        /// restart. A client refuses a server older than one it has met.
        epoch: u64,
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
    /// GEO mode: the rows changed since the trainer last asked ([`Request::Changed`]).
    Changed {
        /// The server cannot say which (it restarted, or the trainer fell so far behind that
        /// the server forgot): every row the trainer holds may have changed.
        all: bool,
        /// The ids changed, per sparse table (empty when `all`).
        ids: Vec<Cow<'a, [u64]>>,
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
