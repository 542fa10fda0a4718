//! The plain text format of prepared data sets: one sample per line, whitespace-separated,
//! `label dense_1 .. dense_D id_1 .. id_S`, where D and S are the model's dense features and
//! slots (the batch's shape). Labels and dense values are decimal numbers, ids unsigned
//! integers used as they are (a word's dictionary index, an already hashed feature). The UCI
//! housing and PTB N-gram examples are prepared into it by `oar data prepare`.

use super::Batch;

/// Parses one line (without its newline) and appends it to `batch`. On error nothing is
/// appended and the reason names the column.
pub fn parse_line(line: &[u8], batch: &mut Batch) -> Result<(), String> {
    let text = std::str::from_utf8(line).map_err(|_| "not UTF-8 text".to_string())?;
    let (d, s) = (batch.dense_width, batch.slots);
    let mut fields = text.split_ascii_whitespace();
    let number = |f: Option<&str>, what: &dyn Fn() -> String| -> Result<f32, String> {
        let f = f.ok_or_else(|| {
            format!("{} columns expected (label, {d} dense, {s} ids): {} is missing", 1 + d + s, what())
        })?;
        match f.parse::<f32>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(format!("{} is not a finite number: {f:?}", what())),
        }
    };
    let label = number(fields.next(), &|| "the label".into())?;
    let start = batch.dense.len();
    for j in 0..d {
        match number(fields.next(), &|| format!("dense feature {}", j + 1)) {
            Ok(v) => batch.dense.push(v),
            Err(e) => {
                batch.dense.truncate(start);
                return Err(e);
            }
        }
    }
    let mut ids = Vec::with_capacity(s);
    for j in 0..s {
        let parsed = fields.next().ok_or_else(|| format!("{} columns expected: id {} is missing", 1 + d + s, j + 1));
        let f = match parsed {
            Ok(f) => f,
            Err(e) => {
                batch.dense.truncate(start);
                return Err(e);
            }
        };
        match f.parse::<u64>() {
            Ok(v) => ids.push(v),
            Err(_) => {
                batch.dense.truncate(start);
                return Err(format!("id {} is not an unsigned integer: {f:?}", j + 1));
            }
        }
    }
    if fields.next().is_some() {
        batch.dense.truncate(start);
        return Err(format!("more than {} columns (label, {d} dense, {s} ids)", 1 + d + s));
    }
    batch.labels.push(label);
    batch.ids.extend_from_slice(&ids);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dense_and_id_columns_and_names_bad_ones() {
        let mut b = Batch::new(2, 3);
        parse_line(b" 24.0  0.5 -1e-2 7 8 9 ", &mut b).unwrap();
        assert_eq!((b.labels.clone(), b.dense.clone(), b.ids.clone()), (vec![24.0], vec![0.5, -0.01], vec![7, 8, 9]));
        assert!(parse_line(b"1 2 3 4 5", &mut b).unwrap_err().contains("id 3 is missing"));
        assert!(parse_line(b"1 2 x 4 5 6", &mut b).unwrap_err().contains("dense feature 2"));
        assert!(parse_line(b"1 2 3 4 -5 6", &mut b).unwrap_err().contains("id 2"));
        assert!(parse_line(b"1 2 3 4 5 6 7", &mut b).unwrap_err().contains("more than 6"));
        assert!(parse_line(b"nan 2 3 4 5 6", &mut b).unwrap_err().contains("label"));
        assert_eq!((b.labels.len(), b.dense.len(), b.ids.len()), (1, 2, 3), "bad lines append nothing");
    }
}
