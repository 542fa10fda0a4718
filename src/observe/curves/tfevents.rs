//! TensorBoard event files: the training curves ([`crate::observe::curves::Point`]) as scalars that
//! TensorBoard (and any reader of its format) shows, one file per trainer under
//! `DIR/trainer-K/`.
//!
//! The format is TFRecord: per record a little-endian u64 length, its masked CRC-32C, the bytes
//! (an `Event` protobuf), their masked CRC-32C; the first event names the file version. Why by
//! hand: the one Rust crate for it (`tensorboard-rs`) is unmaintained and brings a second
//! protobuf runtime; the three messages are declared for `prost` below.

use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;

use crate::observe::curves::{Kind, Point};

/// `tensorflow.Event`, the fields written.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// `tensorflow.Summary.Value` holding a scalar.
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord of `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The tags of a point's values: `loss/KIND` and `auc/KIND` (`steps`, `pass`, `all_trainers`,
/// `test`, `next_day`).
pub fn tags(point: &Point) -> Vec<(String, f32)> {
    let kind = match point.kind {
        Kind::Steps => "steps",
        Kind::Pass => "pass",
        Kind::AllTrainers => "all_trainers",
        Kind::Test => "test",
        Kind::NextDay => "next_day",
    };
    let mut v = Vec::new();
    if let Some(l) = point.loss {
        v.push((format!("loss/{kind}"), l as f32));
    }
    if let Some(a) = point.auc {
        v.push((format!("auc/{kind}"), a as f32));
    }
    v
}

/// One trainer's event file.
pub struct EventFile {
    file: std::fs::File,
    path: PathBuf,
}

impl EventFile {
    /// Creates trainer `trainer`'s event file under `dir/trainer-K/` (a new file per run, as
    /// TensorBoard expects) and writes its version record.
    pub fn create(dir: &Path, trainer: u32) -> std::io::Result<EventFile> {
        let sub = dir.join(format!("trainer-{trainer}"));
        // Not through a link planted at the trainer's folder (it wrote wherever the link led,
        // or failed with "File exists" for a link to a file).
        if std::fs::symlink_metadata(&sub).is_ok_and(|m| m.file_type().is_symlink()) {
            let m = format!("{} is a symbolic link: oar does not write through one", sub.display());
            return Err(std::io::Error::other(m));
        }
        std::fs::create_dir_all(&sub)?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let path = sub.join(format!("events.out.tfevents.{}.oar.{}", now.as_secs(), std::process::id()));
        let file = std::fs::OpenOptions::new().create_new(true).write(true).open(&path)?;
        let mut f = EventFile { file, path };
        let version =
            Event { wall_time: now.as_secs_f64(), file_version: Some("brain.Event:2".into()), ..Default::default() };
        f.file.write_all(&record(&version.encode_to_vec()))?;
        Ok(f)
    }

    /// Appends `point`'s values as scalars at its step.
    pub fn write(&mut self, point: &Point) -> std::io::Result<()> {
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let value = tags(point).into_iter().map(|(tag, v)| Value { tag, simple_value: Some(v) }).collect();
        let event = Event {
            wall_time: wall.as_secs_f64(),
            step: point.step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        };
        self.file.write_all(&record(&event.encode_to_vec()))?;
        self.file.flush()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_tensorflows_masked_crc32c() {
        // CRC-32C of "123456789" is 0xe3069283 (RFC 3720's check value); the mask is TFRecord's.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let r = record(b"abc");
        assert_eq!(&r[..8], &3u64.to_le_bytes());
        assert_eq!(u32::from_le_bytes(r[8..12].try_into().unwrap()), masked_crc(&3u64.to_le_bytes()));
        assert_eq!(&r[12..15], b"abc");
        let c = crc32c::crc32c(b"abc");
        assert_eq!(u32::from_le_bytes(r[15..19].try_into().unwrap()), c.rotate_right(15).wrapping_add(0xa282_ead8));
    }
}
