//! `oar gen conversions`: impressions with a click and a conversion after the click, in
//! PaddleRec's Ali-CCP format (`id,click,ctcvr,field:id,...`, what `examples/zoo/esmm.toml`
//! reads), from a planted model with a task relation: the same ids drive both the click and the
//! conversion, and a conversion is only ever seen after a click (ESMM's setting: CTCVR =
//! CTR x CVR over every impression). Built like [`crate::data::gen`]: every draw a pure function of
//! (seed, stream, line); `meta.json` has the planted model's CTCVR test AUC (and its CTR AUC
//! in `planted`).
//!
//! A line is one impression of an item to a user, five fields (Ali-CCP's names):
//! - `101` user (Zipf(1.1) over 50,000), `121` the user's group (user mod 100), `205` item
//!   (Zipf(1.1) over 50,000), `206` the item's category (item mod 200), `207` its shop (item mod
//!   1,000);
//! - each id has a click weight and a conversion weight, normal with standard deviations 0.8
//!   and 0.4, correlated 0.5 (the tasks' relation);
//! - `pCTR = sigmoid(-2.2 + sum of click weights)`, `pCVR = sigmoid(-1.8 + sum of conversion
//!   weights)`; click ~ pCTR, then a conversion ~ pCVR only after a click; `ctcvr` = click and
//!   conversion (about a quarter of the impressions click, 4-5% convert).

use std::io::Write;

use crate::base::layout::mix64;
use crate::data::gen::{sigmoid, write_parts, zipf, Draws, GenConfig, PlantedReport};

/// Users.
pub const USERS: u32 = 50_000;
/// Items.
pub const ITEMS: u32 = 50_000;
/// Bias of the click logit.
pub const CTR_BIAS: f64 = -2.2;
/// Bias of the conversion logit (given a click).
pub const CVR_BIAS: f64 = -1.8;
/// Standard deviation of each id's click weight.
pub const CTR_STD: f64 = 0.8;
/// Standard deviation of each id's conversion weight.
pub const CVR_STD: f64 = 0.4;
/// Correlation of an id's click and conversion weights.
pub const CORRELATION: f64 = 0.5;

/// The click and conversion weights of id `value` in field `field`.
fn weights(seed: u64, field: u32, value: u32) -> (f64, f64) {
    let d = Draws { base: mix64(seed ^ 0xc0de ^ mix64((field as u64) << 32 | value as u64)) };
    let (a, b) = (d.normal(0), d.normal(1));
    let cvr = CORRELATION * a + (1.0 - CORRELATION * CORRELATION).sqrt() * b;
    (CTR_STD * a, CVR_STD * cvr)
}

/// One impression: its five (field, id) pairs, the planted pCTR and pCVR, and what happened.
struct Impression {
    fields: [(u32, u32); 5],
    ctr: f64,
    cvr: f64,
    click: bool,
    conversion: bool,
}

/// Line `line` of `stream`.
fn impression(seed: u64, stream: u64, line: u64) -> Impression {
    let d = Draws::new(seed ^ 0xe55, stream, line);
    let user = zipf(d.uniform(1), USERS, 1.1);
    let item = zipf(d.uniform(2), ITEMS, 1.1);
    let fields = [(101, user), (121, user % 100), (205, item), (206, item % 200), (207, item % 1000)];
    let (mut ctr, mut cvr) = (CTR_BIAS, CVR_BIAS);
    for &(field, value) in &fields {
        let (a, b) = weights(seed, field, value);
        ctr += a;
        cvr += b;
    }
    let (ctr, cvr) = (sigmoid(ctr), sigmoid(cvr));
    let click = d.uniform(10) < ctr;
    let conversion = click && d.uniform(11) < cvr;
    Impression { fields, ctr, cvr, click, conversion }
}

/// Writes line `line` of `stream` into `out`; returns (ctcvr label, planted pCTCVR).
fn write_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let i = impression(seed, stream, line);
    let w = |r: std::io::Result<()>| r.expect("writing to a Vec cannot fail");
    w(write!(out, "{line},{},{}", i.click as u8, i.conversion as u8));
    for (field, value) in i.fields {
        w(write!(out, ",{field}:{}", field as u64 * 1_000_000 + value as u64));
    }
    w(writeln!(out));
    (i.conversion as u8 as f32, i.ctr * i.cvr)
}

/// Generates the data set described by `config`.
pub fn generate(config: &GenConfig) -> anyhow::Result<PlantedReport> {
    let report = write_parts(config, &write_line)?;
    // The planted CTR's AUC on the test lines' clicks (the report's AUC is CTCVR's).
    let (mut clicks, mut probs) = (Vec::new(), Vec::new());
    for line in 0..config.test_lines {
        let i = impression(config.seed, 2, line);
        clicks.push(i.click as u8 as f32);
        probs.push(i.ctr as f32);
    }
    let planted = serde_json::json!({
        "users": USERS,
        "items": ITEMS,
        "ctr_bias": CTR_BIAS,
        "cvr_bias": CVR_BIAS,
        "ctr_std": CTR_STD,
        "cvr_std": CVR_STD,
        "correlation": CORRELATION,
        "oracle_test_ctr_auc": crate::observe::metrics::auc(&probs, &clicks),
        "format": "id,click,ctcvr,field:id,... (PaddleRec's Ali-CCP sample format; labels click and ctcvr)",
    });
    PlantedReport { report, planted }.save(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_reproducible_in_aliccp_format_and_convert_only_after_a_click() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut clicks, mut conversions, mut labels, mut probs) = (0, 0, Vec::new(), Vec::new());
        for line in 0..20_000 {
            let (y, p) = write_line(3, 1, line, &mut a);
            write_line(3, 1, line, &mut b);
            labels.push(y);
            probs.push(p as f32);
        }
        assert_eq!(a, b);
        for line in String::from_utf8(a).unwrap().lines() {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 8, "{line}");
            let (click, ctcvr): (u8, u8) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            assert!(ctcvr <= click, "a conversion only after a click: {line}");
            clicks += click as u32;
            conversions += ctcvr as u32;
            for (token, field) in f[3..].iter().zip(["101", "121", "205", "206", "207"]) {
                assert_eq!(token.split(':').next().unwrap(), field, "{line}");
            }
        }
        let (ctr, ctcvr) = (clicks as f64 / 20_000.0, conversions as f64 / 20_000.0);
        assert!((0.15..0.35).contains(&ctr) && (0.02..0.08).contains(&ctcvr), "CTR {ctr}, CTCVR {ctcvr}");
        let auc = crate::observe::metrics::auc(&probs, &labels).unwrap();
        assert!(auc > 0.75, "planted CTCVR AUC {auc}");
    }
}
