//! `oar gen criteo`: Criteo-format lines from a planted logistic model, so demos, tests and
//! benchmarks need no download (Criteo's data may not be redistributed).
//!
//! Modeled on `../shared/tools/gen_criteo_synth.py` (same per-slot vocabulary sizes, missing
//! rates and integer distributions, Zipf-skewed values, label ~ Bernoulli(sigmoid(logit)) of an
//! additive model), but self-contained: every random draw is a pure function of (seed, stream,
//! line, field), so parts are generated in parallel and any line can be regenerated alone.
//! The planted model's own AUC on the test split (the oracle) is written to `meta.json`.
//!
//! The same planted model, turned a little each day (`Drift`: new ids arrive, old ones go quiet,
//! weights turn), makes the day folders of `oar gen stream` ([`stream`]). The other generators
//! plant what the model zoo's layers are built to learn, in the formats those models read:
//! multi-hot slots ([`slots`]), behaviour sequences ([`sequences`]), clicks and conversions
//! ([`conversions`]), interactions of field pairs ([`interactions`]) and related tasks
//! ([`tasks`]).

pub mod conversions;
pub mod interactions;
pub mod sequences;
pub mod slots;
pub mod stream;
pub mod tasks;

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::base::layout::mix64;
use crate::data::format::criteo::{DENSE, SLOTS};
use crate::observe::metrics;

const CAT_VOCAB: [u32; SLOTS] = [
    1460, 583, 1_000_000, 1_000_000, 305, 24, 12517, 633, 3, 93145, 5683, 1_000_000, 3194, 27, 14992, 1_000_000, 10,
    5652, 2173, 4, 1_000_000, 18, 15, 286_181, 105, 142_572,
];
const CAT_MISSING: [f64; SLOTS] = [
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.03,
    0.0, 0.76, 0.03, 0.44, 0.44,
];
const CAT_WSTD: [f64; SLOTS] = [
    0.35, 0.30, 0.45, 0.40, 0.30, 0.30, 0.35, 0.30, 0.30, 0.40, 0.35, 0.45, 0.30, 0.30, 0.35, 0.40, 0.30, 0.30, 0.30,
    0.25, 0.40, 0.25, 0.25, 0.40, 0.25, 0.35,
];
const INT_MISSING: [f64; DENSE] = [0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.77, 0.22];
const INT_LOGMU: [f64; DENSE] = [0.7, 1.5, 1.8, 1.5, 7.5, 3.0, 1.5, 2.0, 3.3, -0.5, 0.5, -0.5, 1.5];
const INT_LOGSD: [f64; DENSE] = [1.2, 2.0, 1.5, 1.0, 1.8, 1.8, 1.5, 1.2, 1.5, 1.0, 1.0, 1.2, 1.2];
const INT_W: [f64; DENSE] = [0.25, -0.15, 0.10, -0.20, -0.25, 0.15, 0.30, -0.10, 0.20, 0.30, 0.35, 0.15, -0.20];
const INT_MISS_W: [f64; DENSE] = [-0.10, 0.0, 0.05, 0.10, -0.05, 0.05, 0.0, 0.0, 0.0, -0.10, 0.0, 0.05, 0.05];
const BIAS: f64 = -1.80;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Training lines.
    pub lines: u64,
    /// Test lines (a separate stream: the same seed always gives the same test set).
    pub test_lines: u64,
    /// Seed of the planted model and of the streams.
    pub seed: u64,
    /// Training part files.
    pub parts: usize,
    /// Output folder: `train/part-NNNNN`, `test/part-00000`, `meta.json`.
    pub out: PathBuf,
}

/// What was generated.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenReport {
    /// Seed used.
    pub seed: u64,
    /// Training lines written.
    pub train_lines: u64,
    /// Test lines written.
    pub test_lines: u64,
    /// Training part files.
    pub parts: usize,
    /// Share of positive training labels.
    pub train_ctr: f64,
    /// AUC of the planted model itself on the test split.
    pub oracle_test_auc: Option<f64>,
    /// Log-loss of the planted model on the test split.
    pub oracle_test_logloss: f64,
}

/// What a model family's generator wrote (`meta.json`): the usual report and the planted
/// model's constants.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PlantedReport {
    /// Lines, label rate, the planted model's test AUC and log-loss.
    #[serde(flatten)]
    pub report: GenReport,
    /// The planted model's constants (and figures the report has no field for).
    pub planted: serde_json::Value,
}

impl PlantedReport {
    /// Writes it to `config.out/meta.json` and returns it.
    pub(crate) fn save(self, config: &GenConfig) -> anyhow::Result<PlantedReport> {
        write_meta(config, &self)?;
        Ok(self)
    }
}

/// Counter-based random numbers: draw `k` of line `line` in `stream`.
#[derive(Clone, Copy)]
pub(crate) struct Draws {
    pub(crate) base: u64,
}

impl Draws {
    pub(crate) fn new(seed: u64, stream: u64, line: u64) -> Draws {
        Draws { base: mix64(mix64(seed ^ 0x5eed) ^ mix64(stream << 40 ^ line)) }
    }
    /// Uniform in [0, 1).
    pub(crate) fn uniform(&self, k: u64) -> f64 {
        ((mix64(self.base.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15))) >> 11) as f64)
            * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal (uses uniform draws `2k` and `2k + 1`).
    pub(crate) fn normal(&self, k: u64) -> f64 {
        let u1 = self.uniform(2 * k).max(1e-300);
        let u2 = self.uniform(2 * k + 1);
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The planted model's weight of value rank `r` in slot `s`.
fn cat_weight(seed: u64, s: usize, r: u32) -> f64 {
    let d = Draws { base: mix64(seed ^ mix64(((s as u64 + 1) << 32) | r as u64)) };
    0.85 * CAT_WSTD[s] * d.normal(0)
}

/// Zipf-like rank in 0..v by inverting the continuous power-law CDF (exponent 1.1 for big
/// vocabularies, 0.8 for small ones, as the Python reference).
fn zipf_rank(u: f64, v: u32) -> u32 {
    zipf(u, v, if v >= 1000 { 1.1 } else { 0.8 })
}

/// The logistic function: a planted model's probability of its logit.
pub(crate) fn sigmoid(logit: f64) -> f64 {
    1.0 / (1.0 + (-logit).exp())
}

/// Rank in 0..v of uniform `u` under the continuous power law of exponent `a` (not 1).
pub(crate) fn zipf(u: f64, v: u32, a: f64) -> u32 {
    let n = v as f64 + 1.0;
    let x = (((n.powf(1.0 - a) - 1.0) * u + 1.0).powf(1.0 / (1.0 - a))) - 1.0;
    (x as u32).min(v - 1)
}

/// The 8 hex digits standing for rank `r` of slot `s`: a bijective affine map on 32 bits.
fn cat_hex(seed: u64, s: usize, r: u32) -> u32 {
    let h = mix64(seed ^ (0xabcd_0000 + s as u64));
    let mul = (h as u32) | 1;
    r.wrapping_mul(mul).wrapping_add((h >> 32) as u32)
}

/// Writes line `line` of `stream` into `out` and returns (label, planted probability).
fn write_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    planted_line(seed, stream, line, None, out)
}

/// How a day of a drifting stream differs from day 0 (see [`crate::data::gen::stream`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Drift {
    /// Days since the stream began.
    pub day: u32,
}

impl Drift {
    /// Share of a slot's vocabulary, the most frequent values, whose ids never change.
    const HEAD: u32 = 100;
    /// Angle (radians) by which each value's planted weight turns per day.
    const TURN: f64 = 0.05;

    /// The id index of rank `r` of slot `s` today: the head keeps its ids; below it, ranks
    /// move down by 1% of the vocabulary a day, so new ids enter below the head and old ones
    /// sink into the tail and go quiet. Tail ids live above bit 31, apart from the head's.
    fn index(self, s: usize, r: u32) -> u32 {
        let head = CAT_VOCAB[s] / Self::HEAD;
        if r < head || head == 0 {
            r
        } else {
            (r.wrapping_sub(head.wrapping_mul(self.day)) & 0x7fff_ffff) | 0x8000_0000
        }
    }

    /// The planted weight of id index `i` of slot `s` today: two independent weights mixed by
    /// an angle that turns slowly, so the model drifts at a constant spread.
    fn weight(self, seed: u64, s: usize, i: u32) -> f64 {
        let a = self.day as f64 * Self::TURN;
        cat_weight(seed, s, i) * a.cos() + cat_weight(seed ^ 0xd81f7, s, i) * a.sin()
    }
}

/// Writes line `line` of `stream` (drifting as `drift` says, if at all) into `out` and returns
/// (label, planted probability).
pub(crate) fn planted_line(seed: u64, stream: u64, line: u64, drift: Option<Drift>, out: &mut Vec<u8>) -> (f32, f64) {
    let d = Draws::new(seed, stream, line);
    let mut logit = BIAS;
    let mut ints = [None; DENSE];
    for j in 0..DENSE {
        let g = INT_LOGMU[j] + INT_LOGSD[j] * d.normal(j as u64);
        let mut x = g.exp().floor() as i64;
        if j == 1 && d.uniform(100 + j as u64) < 0.05 {
            x -= 1;
        }
        if d.uniform(200 + j as u64) < INT_MISSING[j] {
            logit += INT_MISS_W[j];
        } else {
            let z = ((x.max(0) as f64).ln_1p() - INT_LOGMU[j].max(0.0)) / INT_LOGSD[j];
            logit += INT_W[j] * z;
            ints[j] = Some(x);
        }
    }
    let mut cats = [None; SLOTS];
    for s in 0..SLOTS {
        if d.uniform(300 + s as u64) < CAT_MISSING[s] {
            logit += 0.1 * Draws { base: mix64(seed ^ 0x77 ^ s as u64) }.normal(0);
        } else {
            let r = zipf_rank(d.uniform(400 + s as u64), CAT_VOCAB[s]);
            let (i, w) = match drift {
                None => (r, cat_weight(seed, s, r)),
                Some(drift) => {
                    let i = drift.index(s, r);
                    (i, drift.weight(seed, s, i))
                }
            };
            logit += w;
            cats[s] = Some(cat_hex(seed, s, i));
        }
    }
    let p = sigmoid(logit);
    let label = (d.uniform(999) < p) as u8;
    write!(out, "{label}").expect("writing to a Vec cannot fail");
    for x in ints {
        out.push(b'\t');
        if let Some(x) = x {
            write!(out, "{x}").expect("writing to a Vec cannot fail");
        }
    }
    for c in cats {
        out.push(b'\t');
        if let Some(c) = c {
            write!(out, "{c:08x}").expect("writing to a Vec cannot fail");
        }
    }
    out.push(b'\n');
    (label as f32, p)
}

/// Labels and planted probabilities of one written part.
type PartResult = std::io::Result<(Vec<f32>, Vec<f32>)>;

/// A line writer: line `line` of `stream` for `seed` into the buffer; returns (label, planted
/// probability). A closure, so a generator may carry a planted model it computed once.
pub(crate) type WriteLine<'a> = &'a (dyn Fn(u64, u64, u64, &mut Vec<u8>) -> (f32, f64) + Sync);

/// Writes lines `range` of `stream` to `path`; returns labels and planted probabilities.
pub(crate) fn write_part(
    write_line: WriteLine,
    seed: u64,
    stream: u64,
    range: std::ops::Range<u64>,
    path: &Path,
) -> PartResult {
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        crate::base::state_file::create_plain(path).map_err(std::io::Error::other)?,
    );
    let (mut labels, mut probs) = (Vec::new(), Vec::new());
    let mut buf = Vec::with_capacity(1 << 16);
    for line in range {
        let (y, p) = write_line(seed, stream, line, &mut buf);
        labels.push(y);
        probs.push(p as f32);
        if buf.len() > 60_000 {
            f.write_all(&buf)?;
            buf.clear();
        }
    }
    f.write_all(&buf)?;
    f.flush()?;
    Ok((labels, probs))
}

/// Generates the data set described by `config`.
pub fn generate(config: &GenConfig) -> anyhow::Result<GenReport> {
    let report = write_parts(config, &write_line)?;
    write_meta(config, &report)?;
    Ok(report)
}

/// Writes `config.out/meta.json`.
pub(crate) fn write_meta(config: &GenConfig, meta: &impl serde::Serialize) -> anyhow::Result<()> {
    Ok(crate::base::state_file::write_json(&config.out.join("meta.json"), meta)?)
}

/// Writes the train parts (stream 1) and the test part (stream 2) of `config` with
/// `write_line`, parts in parallel, and measures the planted model on the test part.
pub(crate) fn write_parts(config: &GenConfig, write_line: WriteLine) -> anyhow::Result<GenReport> {
    use anyhow::Context;
    crate::data::read::files::check_parts(config.parts).map_err(anyhow::Error::msg)?;
    crate::data::read::files::check_fill(config.parts, config.lines, "train line(s)").map_err(anyhow::Error::msg)?;
    let train_dir = config.out.join("train");
    let test_dir = config.out.join("test");
    for (d, parts) in [(&train_dir, config.parts), (&test_dir, 1)] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        crate::data::read::files::check_no_stale_parts(d, "part-", parts).map_err(anyhow::Error::msg)?;
    }
    let mut jobs = Vec::new();
    let mut start = 0;
    for (i, n) in crate::data::read::files::part_sizes(config.lines, config.parts).enumerate() {
        jobs.push((1u64, start..start + n, train_dir.join(format!("part-{i:05}"))));
        start += n;
    }
    jobs.push((2, 0..config.test_lines, test_dir.join("part-00000")));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<PartResult>>> = jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.min(jobs.len()) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((stream, range, path)) = jobs.get(k) else { return };
                let r = write_part(write_line, config.seed, *stream, range.clone(), path);
                *results[k].lock().expect("no panics while holding this lock") = Some(r);
            });
        }
    });
    let mut train_pos = 0.0;
    let mut test = (Vec::new(), Vec::new());
    for (k, r) in results.into_iter().enumerate() {
        let r = r.into_inner().expect("no panics while holding this lock").expect("every job ran");
        let (labels, probs) = r.with_context(|| format!("cannot write {}", jobs[k].2.display()))?;
        if jobs[k].0 == 1 {
            train_pos += labels.iter().sum::<f32>() as f64;
        } else {
            test = (labels, probs);
        }
    }
    let report = GenReport {
        seed: config.seed,
        train_lines: config.lines,
        test_lines: config.test_lines,
        parts: config.parts,
        train_ctr: train_pos / config.lines.max(1) as f64,
        oracle_test_auc: metrics::auc(&test.1, &test.0),
        oracle_test_logloss: metrics::log_loss(&test.1, &test.0),
    };
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_valid_criteo_and_reproducible() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for line in 0..200 {
            write_line(1, 1, line, &mut a);
            write_line(1, 1, line, &mut b);
        }
        assert_eq!(a, b);
        let mut batch = crate::data::Batch::new(1, DENSE, SLOTS);
        for line in a.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            crate::data::format::criteo::parse_line(line, &mut batch).unwrap();
        }
        assert_eq!(batch.len(), 200);
        let ctr = batch.labels.iter().sum::<f32>() / 200.0;
        assert!((0.1..0.4).contains(&ctr), "ctr {ctr}");
    }

    #[test]
    fn zipf_ranks_stay_in_range_and_favor_small_ranks() {
        let v = 1000;
        let ranks: Vec<u32> = (0..1000).map(|i| zipf_rank(i as f64 / 1000.0, v)).collect();
        assert!(ranks.iter().all(|&r| r < v));
        assert!(ranks.iter().filter(|&&r| r < 10).count() > 300);
    }
}
