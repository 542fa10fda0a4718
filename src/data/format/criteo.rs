//! The Criteo display-advertising TSV format: `label, I1..I13, C1..C26`, tab-separated, empty
//! field = missing, trailing empty fields possibly stripped, integers possibly negative.
//!
//! Integer features become `ln(1 + max(x, 0))` (missing and negative values give 0: Criteo's
//! few negatives are -1/-2 sentinels). Each categorical value is hashed together with its slot
//! into a u64 id; a missing value gets its own id per slot, so "missing" is learned too.
//!
//! Its [`Schema`](crate::data::Schema) is [`Schema::criteo`](crate::data::Schema::criteo): label `label`,
//! dense column `I` of width 13, slots `C1`..`C26`; every bag holds one id (one-hot).

use crate::base::layout::mix64;
use crate::data::{Batch, LineParser};

/// Integer features per line.
pub const DENSE: usize = 13;
/// Categorical slots per line.
pub const SLOTS: usize = 26;
const FIELDS: usize = 1 + DENSE + SLOTS;

/// The id of categorical `value` in slot `slot` (0-based). Distinct (slot, value) pairs of
/// Criteo's 8-hex-digit values never collide: the key is injective and `mix64` is a bijection.
pub fn feature_id(slot: usize, value: &[u8]) -> u64 {
    let key = if value.is_empty() {
        (1 << 62) | slot as u64
    } else if let Some(v) = parse_hex8(value) {
        ((slot as u64 + 1) << 32) | v as u64
    } else {
        // Not Criteo's hex form: FNV-1a over the bytes, tagged apart from the keys above.
        let h = value.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        (1 << 63) | ((h ^ ((slot as u64) << 48)) & ((1 << 62) - 1))
    };
    mix64(key)
}

fn parse_hex8(v: &[u8]) -> Option<u32> {
    if v.len() != 8 {
        return None;
    }
    let mut x = 0u32;
    for &c in v {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        x = (x << 4) | d as u32;
    }
    Some(x)
}

fn parse_int(v: &[u8]) -> Option<i64> {
    let (neg, digits) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        _ => (false, v),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut x = 0i64;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        x = x * 10 + (c - b'0') as i64;
    }
    Some(if neg { -x } else { x })
}

/// The dense feature value of integer `x` (see the module doc).
#[inline]
pub fn dense_value(x: i64) -> f32 {
    (x.max(0) as f64).ln_1p() as f32
}

/// The Criteo [`LineParser`] (stateless: [`parse_line`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct CriteoParser;

impl LineParser for CriteoParser {
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String> {
        parse_line(line, batch)
    }
}

/// Parses one line (without its newline) and appends it to `batch` (label width 1, 13 dense,
/// 26 slots). On error nothing is appended and the reason names the field.
pub fn parse_line(line: &[u8], batch: &mut Batch) -> Result<(), String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = [&b""[..]; FIELDS];
    for (n, f) in line.split(|&c| c == b'\t').enumerate() {
        if n == FIELDS {
            return Err(format!("more than {FIELDS} tab-separated fields"));
        }
        fields[n] = f;
    }
    let label = match fields[0] {
        b"0" => 0.0,
        b"1" => 1.0,
        other => return Err(format!("label must be 0 or 1, found {:?}", String::from_utf8_lossy(other))),
    };
    let mut dense = [0.0f32; DENSE];
    for (j, d) in dense.iter_mut().enumerate() {
        let f = fields[1 + j];
        if !f.is_empty() {
            let x = parse_int(f)
                .ok_or_else(|| format!("I{} is not an integer: {:?}", j + 1, String::from_utf8_lossy(f)))?;
            *d = dense_value(x);
        }
    }
    let ids: [u64; SLOTS] = std::array::from_fn(|s| feature_id(s, fields[1 + DENSE + s]));
    batch.labels.push(label);
    batch.dense.extend_from_slice(&dense);
    if batch.offsets.is_empty() && batch.weights.is_empty() {
        // One-hot so far (always, unless other batches were appended): one id per bag.
        batch.ids.extend_from_slice(&ids);
    } else {
        for id in ids {
            batch.push_bag(&[id], None);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_line_with_missing_fields() {
        let line = b"0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16";
        let mut b = Batch::new(1, DENSE, SLOTS);
        parse_line(line, &mut b).unwrap();
        assert_eq!(b.labels, [0.0]);
        assert_eq!(b.dense[0], 2f32.ln());
        assert_eq!(b.dense[11], 0.0, "I12 is missing");
        assert_eq!(b.ids[0], feature_id(0, b"68fd1e64"));
        assert_eq!(b.ids[21], feature_id(21, b""));
        assert_ne!(feature_id(0, b"68fd1e64"), feature_id(1, b"68fd1e64"));
        assert!(b.offsets.is_empty() && b.weights.is_empty(), "criteo bags are one-hot");
    }

    #[test]
    fn short_lines_are_padded_and_negatives_accepted() {
        let mut b = Batch::new(1, DENSE, SLOTS);
        parse_line(b"1\t-1\t-2", &mut b).unwrap();
        assert_eq!(b.labels, [1.0]);
        assert_eq!(&b.dense[..2], &[0.0, 0.0]);
        assert_eq!(b.ids.len(), SLOTS);
        assert_eq!(b.ids[25], feature_id(25, b""));
    }

    #[test]
    fn bad_fields_name_themselves() {
        let mut b = Batch::new(1, DENSE, SLOTS);
        assert!(parse_line(b"2\t1", &mut b).unwrap_err().contains("label"));
        assert!(parse_line(b"1\t1\tx7", &mut b).unwrap_err().contains("I2"));
        let long = vec![b'0'; 0].into_iter().chain("1\t".repeat(41).bytes()).collect::<Vec<u8>>();
        assert!(parse_line(&long, &mut b).unwrap_err().contains("more than 40"));
        assert_eq!(b, Batch::new(1, DENSE, SLOTS), "a bad line appends nothing");
    }
}
