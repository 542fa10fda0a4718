//! The layout of every message: which fields, in which order, each request and response
//! holds, written and read with [`super::fields`]' frames and decoders.

use std::borrow::Cow;

use super::fields::{Decoder, Encoder, Frame};
use super::*;

pub(super) mod kind {
    pub const HELLO: u8 = 1;
    pub const DECLARE: u8 = 2;
    pub const PULL: u8 = 3;
    pub const PUSH: u8 = 4;
    pub const BARRIER: u8 = 5;
    pub const SAVE: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const STATS: u8 = 8;
    pub const END_PASS: u8 = 9;
    // 10 and 11 are the secret's frames (`protocol::auth`).
    pub const PASS_AUC: u8 = 12;
    pub const GLOBAL_AUC: u8 = 13;
    pub const SHRINK: u8 = 14;
    pub const EXPORT: u8 = 15;
    pub const COMMIT: u8 = 16;
    pub const CHANGED: u8 = 17;
    pub const WELCOME: u8 = 101;
    pub const DONE: u8 = 102;
    pub const VALUES: u8 = 103;
    pub const PUSHED: u8 = 104;
    pub const SAVED: u8 = 105;
    pub const STATS_REPLY: u8 = 106;
    pub const ERROR: u8 = 107;
    pub const CHANGED_IDS: u8 = 108;
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
                e.u64(MAGIC)
                    .u64(h.version)
                    .u64(h.num_servers)
                    .u64(h.server_index)
                    .u64(h.trainer)
                    .u64(h.epoch)
                    .bytes(h.job.as_bytes());
                e.finish()
            }
            Request::Declare(declaration) => {
                let json = serde_json::to_vec(declaration).expect("a declaration always serializes");
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
                e.u64(p.trainer).u64(p.step).u64(p.pass).u64(p.base_version).u64(p.samples).u64(p.part as u64);
                e.u64(p.apply as u64);
                e.f32_chunks(&p.dense);
                e.u64(p.sparse.len() as u64);
                for s in &p.sparse {
                    e.u64(s.table as u64).u64s(&s.ids).f32s(&s.counts).f32s(&s.grads);
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
            Request::PassAuc { trainer, pass, pos, neg, sums } => {
                let mut e = Encoder::new(kind::PASS_AUC);
                e.u64(*trainer).u64(*pass).u64s(pos).u64s(neg).f64(sums[0]).f64(sums[1]).f64(sums[2]);
                e.finish()
            }
            Request::GlobalAuc { pass } => {
                let mut e = Encoder::new(kind::GLOBAL_AUC);
                e.u64(*pass);
                e.finish()
            }
            Request::Shrink { days, day_end } => {
                let mut e = Encoder::new(kind::SHRINK);
                e.u64(*days).u64(*day_end);
                e.finish()
            }
            Request::Changed { trainer } => {
                let mut e = Encoder::new(kind::CHANGED);
                e.u64(*trainer);
                e.finish()
            }
            Request::Commit { trainer, step } => {
                let mut e = Encoder::new(kind::COMMIT);
                e.u64(*trainer).u64(*step);
                e.finish()
            }
            Request::Export { dir, kind } => {
                let mut e = Encoder::new(kind::EXPORT);
                e.bytes(dir.as_bytes()).u64(*kind as u64);
                e.finish()
            }
        }
    }

    /// Decodes a request from a frame's kind and aligned payload; arrays borrow from `payload`.
    pub fn decode(kind: u8, payload: &'a [u8]) -> Result<Request<'a>, ProtocolError> {
        let mut d = Decoder::new(payload);
        let req = match kind {
            kind::HELLO => {
                if d.u64()? != MAGIC {
                    return Err(ProtocolError::Malformed("bad magic: not an oar client".into()));
                }
                let version = d.u64()?;
                let num_servers = d.u64()?;
                let server_index = d.u64()?;
                let trainer = d.u64()?;
                let epoch = d.u64()?;
                let job = d.string()?;
                Request::Hello(Hello { version, job, num_servers, server_index, trainer, epoch })
            }
            kind::DECLARE => {
                let json = d.bytes()?;
                let declaration =
                    serde_json::from_slice(json).map_err(|e| ProtocolError::Malformed(format!("declaration: {e}")))?;
                Request::Declare(declaration)
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
                let part = enum_field(d.u64()?, &[PushPart::Whole, PushPart::Dense, PushPart::Sparse], "push part")?;
                let apply = enum_field(
                    d.u64()?,
                    &[Apply::Now, Apply::Merged, Apply::StalenessScaled, Apply::DenseMerged],
                    "push apply rule",
                )?;
                let dense: Cow<'a, [f32]> = d.array()?;
                let dense = if dense.is_empty() { vec![] } else { vec![dense] };
                let n = d.count(32)?;
                let mut sparse = Vec::with_capacity(n);
                for _ in 0..n {
                    let table = table_index(d.u64()?)?;
                    let ids = d.array()?;
                    let counts = d.array()?;
                    let grads = d.array()?;
                    sparse.push(SparseGrads { table, ids, counts, grads });
                }
                Request::Push(Push { trainer, step, pass, base_version, samples, part, apply, dense, sparse })
            }
            kind::BARRIER => Request::Barrier { trainer: d.u64()?, epoch: d.u64()? },
            kind::END_PASS => Request::EndPass { trainer: d.u64()?, pass: d.u64()? },
            kind::SAVE => Request::Save { dir: d.string()? },
            kind::CLOSE => Request::Close { trainer: d.u64()? },
            kind::STATS => Request::Stats,
            kind::PASS_AUC => Request::PassAuc {
                trainer: d.u64()?,
                pass: d.u64()?,
                pos: d.array()?,
                neg: d.array()?,
                sums: [d.f64()?, d.f64()?, d.f64()?],
            },
            kind::GLOBAL_AUC => Request::GlobalAuc { pass: d.u64()? },
            kind::SHRINK => Request::Shrink { days: d.u64()?, day_end: d.u64()? },
            kind::COMMIT => Request::Commit { trainer: d.u64()?, step: d.u64()? },
            kind::CHANGED => Request::Changed { trainer: d.u64()? },
            kind::EXPORT => Request::Export {
                dir: d.string()?,
                kind: enum_field(d.u64()?, &[ExportKind::Base, ExportKind::Delta], "save kind")?,
            },
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
            Response::Welcome { server_index, num_servers, epoch } => {
                let mut e = Encoder::new(kind::WELCOME);
                e.u64(*server_index).u64(*num_servers).u64(*epoch);
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
            Response::Changed { all, ids } => {
                let mut e = Encoder::new(kind::CHANGED_IDS);
                e.u64(*all as u64).u64(ids.len() as u64);
                for t in ids {
                    e.u64s(t);
                }
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
        let mut d = Decoder::new(payload);
        let resp = match kind {
            kind::WELCOME => Response::Welcome { server_index: d.u64()?, num_servers: d.u64()?, epoch: d.u64()? },
            kind::DONE => Response::Done,
            kind::VALUES => {
                let version = d.u64()?;
                let dense = d.array()?;
                let n = d.count(8)?;
                let sparse = (0..n).map(|_| d.array()).collect::<Result<_, _>>()?;
                Response::Values { version, dense, sparse }
            }
            kind::PUSHED => {
                let outcome = enum_field(
                    d.u64()?,
                    &[PushOutcome::Applied, PushOutcome::Discarded, PushOutcome::Held, PushOutcome::NotHeld],
                    "push outcome",
                )?;
                Response::Pushed { outcome, version: d.u64()? }
            }
            kind::SAVED => {
                let file = d.string()?;
                let bytes = d.u64()?;
                let crc32 =
                    u32::try_from(d.u64()?).map_err(|_| ProtocolError::Malformed("crc32 out of range".into()))?;
                Response::Saved { file, bytes, crc32 }
            }
            kind::CHANGED_IDS => {
                let all = enum_field(d.u64()?, &[false, true], "changed-rows flag")?;
                let n = d.count(8)?;
                let ids = (0..n).map(|_| d.array()).collect::<Result<_, _>>()?;
                Response::Changed { all, ids }
            }
            kind::STATS_REPLY => Response::Stats(d.string()?),
            kind::ERROR => Response::Error { code: ErrorCode::from_u64(d.u64()?)?, message: d.string()? },
            other => return Err(ProtocolError::Malformed(format!("unknown response kind {other}"))),
        };
        d.end()?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{split_frame, ListedDay};
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
        round_trip_request(Request::Hello(Hello {
            version: 1,
            job: "job-é".into(),
            num_servers: 3,
            server_index: 2,
            trainer: 1,
            epoch: 4,
        }));
        round_trip_request(Request::Declare(Declaration {
            spec: TableSpec {
                dense: DenseSpec {
                    params: vec![DenseParam::new("w", 5, Init::Uniform { scale: 0.1 })],
                    block_size: 8,
                    seed: 1,
                    optimizer: Optimizer::adam(1e-3),
                },
                sparse: vec![],
            },
            model: serde_json::json!({"model": {"slots": 2}}),
            calendar: vec![ListedDay { day: "20260101".into(), files: 4, bytes: 9, digest: "ab".into() }],
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
            part: PushPart::Whole,
            apply: Apply::StalenessScaled,
            dense: vec![vec![1.0, 2.0, 3.0].into()],
            sparse: vec![SparseGrads {
                table: 0,
                ids: vec![9].into(),
                counts: vec![2.0, 1.0].into(),
                grads: vec![0.5; 3].into(),
            }],
        }));
        round_trip_request(Request::Barrier { trainer: 1, epoch: 2 });
        round_trip_request(Request::EndPass { trainer: 1, pass: 3 });
        round_trip_request(Request::Save { dir: "/tmp/x".into() });
        round_trip_request(Request::Close { trainer: 3 });
        round_trip_request(Request::Stats);
        round_trip_request(Request::PassAuc {
            trainer: 1,
            pass: 2,
            pos: vec![3, 0, 5].into(),
            neg: vec![0, 7, 0].into(),
            sums: [1.5, 0.25, 7.0],
        });
        round_trip_request(Request::GlobalAuc { pass: 2 });
        round_trip_request(Request::Changed { trainer: 5 });
        round_trip_request(Request::Shrink { days: 1, day_end: 4 });
        round_trip_request(Request::Export { dir: "/tmp/d".into(), kind: ExportKind::Delta });
    }

    #[test]
    fn every_response_round_trips() {
        round_trip_response(Response::Welcome { server_index: 1, num_servers: 2, epoch: 3 });
        round_trip_response(Response::Done);
        round_trip_response(Response::Changed { all: false, ids: vec![vec![3u64, 9].into(), vec![].into()] });
        round_trip_response(Response::Changed { all: true, ids: vec![] });
        round_trip_response(Response::Values {
            version: 4,
            dense: vec![1.5; 3].into(),
            sparse: vec![vec![2.0; 5].into(), vec![].into()],
        });
        round_trip_response(Response::Pushed { outcome: PushOutcome::Discarded, version: 9 });
        round_trip_response(Response::Pushed { outcome: PushOutcome::NotHeld, version: 9 });
        round_trip_request(Request::Commit { trainer: 1, step: 7 });
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
            part: PushPart::Whole,
            apply: Apply::Now,
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
}
