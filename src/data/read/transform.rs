//! Dense feature scaling: `[data] dense_transform` (`standardize` or `minmax`) with the
//! statistics of the training files (`oar data stats`), applied after the format's own transform
//! (Criteo: `ln(1 + x)`) by every reader of the job's data: training, evaluation, `oar predict`,
//! `oar serve`; the export's graphs apply it to their `dense` input.
//!
//! The statistics travel with the model: a job file may name the statistics file
//! (`dense_stats = "stats.json"`, relative to the job file), which is read once when the job file
//! is, and the saved model's manifest holds the numbers themselves.
//!
//! [`DenseStats`] are the statistics (`oar data stats` computes them), [`Affine`] the scaling they
//! give, and [`Scaled`] the parser wrapper that `data::parser` returns when the job scales.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::{Batch, LineParser};

/// How dense values are scaled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenseTransform {
    /// As the format gives them.
    #[default]
    None,
    /// `(x - mean) / std` per value.
    Standardize,
    /// `(x - min) / (max - min)` per value.
    Minmax,
}

/// Per dense value of the training files: count, mean, standard deviation, minimum, maximum
/// (after the format's own transform).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseStats {
    /// Samples read.
    pub count: u64,
    /// Means.
    pub mean: Vec<f64>,
    /// Standard deviations (population).
    pub std: Vec<f64>,
    /// Minima.
    pub min: Vec<f64>,
    /// Maxima.
    pub max: Vec<f64>,
}

/// `dense_stats` in a job file: a file's path, or (in a saved model) the numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatsSource {
    /// `oar data stats`' output file.
    File(String),
    /// The statistics themselves.
    Inline(DenseStats),
}

impl StatsSource {
    /// The numbers, reading a file relative to `base` (the job file's folder).
    pub fn resolve(&self, base: &Path) -> Result<DenseStats, String> {
        match self {
            StatsSource::Inline(s) => Ok(s.clone()),
            StatsSource::File(f) => {
                let path = base.join(f);
                let bad = |e: String| format!("[data] dense_stats: {}: {e}", path.display());
                let text = crate::base::state_file::read_named(&path, 64 << 20).map_err(|e| bad(e.reason()))?;
                serde_json::from_slice(&text)
                    .map_err(|e| format!("[data] dense_stats: {}: not oar data stats output: {e}", path.display()))
            }
        }
    }
}

impl crate::data::DataConfig {
    /// Whether the dense values are scaled but the statistics are not given yet (they are
    /// computed over the training files when the job starts).
    pub fn needs_stats(&self) -> bool {
        self.dense_transform.is_some_and(|t| t != DenseTransform::None) && self.dense_stats.is_none()
    }

    /// The same data read without any scaling.
    pub fn unscaled(&self) -> crate::data::DataConfig {
        crate::data::DataConfig { dense_transform: None, dense_stats: None, ..self.clone() }
    }
}

/// `y = (x - shift) * scale`, per dense value.
#[derive(Clone, Debug, PartialEq)]
pub struct Affine {
    /// Subtracted first.
    pub shift: Vec<f32>,
    /// Then multiplied.
    pub scale: Vec<f32>,
}

impl Affine {
    /// The affine map of `transform` with `stats` for `width` values; an error names what does
    /// not fit (another width, a non-finite number). A constant value is only shifted.
    pub fn new(transform: DenseTransform, stats: &DenseStats, width: usize) -> Result<Option<Affine>, String> {
        if transform == DenseTransform::None {
            return Ok(None);
        }
        if width == 0 {
            return Err("[data] dense_transform: the data has no dense values to scale".into());
        }
        let lens = [stats.mean.len(), stats.std.len(), stats.min.len(), stats.max.len()];
        if lens.iter().any(|&n| n != width) {
            return Err(format!(
                "[data] dense_stats: {lens:?} values per statistic, the data has {width} dense values"
            ));
        }
        let all = stats.mean.iter().chain(&stats.std).chain(&stats.min).chain(&stats.max);
        // Finite as the f32 the values are scaled in: 1e300 passed as an f64, became an
        // infinity, and every score a constant (AUC 0.5, exit 0).
        if let Some(v) = all.clone().find(|v| !(**v as f32).is_finite()) {
            return Err(format!("[data] dense_stats: a statistic ({v:e}) is not a finite 32-bit number"));
        }
        // Statistics no data gives: they were scaled by 1 and saved with the model, unremarked.
        if stats.count == 0 {
            return Err("[data] dense_stats: statistics of 0 samples".into());
        }
        if let Some((k, s)) = stats.std.iter().enumerate().find(|(_, s)| **s < 0.0) {
            return Err(format!("[data] dense_stats: std of dense value {} is {s}, below 0", k + 1));
        }
        let mut ranges = stats.min.iter().zip(&stats.max).enumerate();
        if let Some((k, (lo, hi))) = ranges.find(|(_, (lo, hi))| lo > hi) {
            return Err(format!("[data] dense_stats: dense value {}'s min {lo} is above its max {hi}", k + 1));
        }
        let inverse = |d: f64| if d > 1e-12 { (1.0 / d) as f32 } else { 1.0 };
        let (shift, scale) = match transform {
            DenseTransform::Standardize => {
                (stats.mean.iter().map(|&m| m as f32).collect(), stats.std.iter().map(|&s| inverse(s)).collect())
            }
            DenseTransform::Minmax => (
                stats.min.iter().map(|&m| m as f32).collect(),
                stats.min.iter().zip(&stats.max).map(|(a, b)| inverse(b - a)).collect(),
            ),
            DenseTransform::None => unreachable!("returned above"),
        };
        Ok(Some(Affine { shift, scale }))
    }

    /// Scales `values` (samples of `shift.len()` values each) in place.
    pub fn apply(&self, values: &mut [f32]) {
        for row in values.chunks_exact_mut(self.shift.len()) {
            for ((v, s), k) in row.iter_mut().zip(&self.shift).zip(&self.scale) {
                *v = (*v - s) * k;
            }
        }
    }
}

/// A parser whose samples' dense values are scaled.
pub struct Scaled {
    /// The format's parser.
    pub inner: Box<dyn LineParser>,
    /// The scaling.
    pub affine: Affine,
}

impl LineParser for Scaled {
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String> {
        self.inner.parse(line, batch)?;
        let w = self.affine.shift.len();
        let at = batch.dense.len() - w;
        self.affine.apply(&mut batch.dense[at..]);
        Ok(())
    }
}

/// Accumulates [`DenseStats`] over batches.
#[derive(Clone, Debug, Default)]
pub struct StatsAccumulator {
    count: u64,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
}

impl StatsAccumulator {
    /// Adds a batch's dense values.
    pub fn add(&mut self, batch: &Batch) {
        let w = batch.dense_width;
        if self.sum.len() != w {
            *self = StatsAccumulator {
                count: 0,
                sum: vec![0.0; w],
                sum_sq: vec![0.0; w],
                min: vec![f64::INFINITY; w],
                max: vec![f64::NEG_INFINITY; w],
            };
        }
        for row in batch.dense.chunks_exact(w.max(1)).take(batch.len()) {
            for (j, &v) in row.iter().enumerate() {
                let v = v as f64;
                self.sum[j] += v;
                self.sum_sq[j] += v * v;
                self.min[j] = self.min[j].min(v);
                self.max[j] = self.max[j].max(v);
            }
        }
        self.count += batch.len() as u64;
    }

    /// The statistics so far.
    pub fn stats(&self) -> DenseStats {
        let n = self.count.max(1) as f64;
        let mean: Vec<f64> = self.sum.iter().map(|s| s / n).collect();
        let std = self.sum_sq.iter().zip(&mean).map(|(q, m)| (q / n - m * m).max(0.0).sqrt()).collect();
        DenseStats { count: self.count, mean, std, min: self.min.clone(), max: self.max.clone() }
    }
}

/// The dense statistics of `files` read as `data` describes them (before any scaling);
/// `on_progress(bytes read)` is called as batches arrive.
pub fn compute(
    files: Vec<std::path::PathBuf>,
    data: &crate::data::DataConfig,
    shorthand: Option<(usize, usize)>,
    on_progress: &dyn Fn(u64),
) -> anyhow::Result<DenseStats> {
    let schema = crate::data::Schema::resolve(&data.unscaled(), shorthand).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(schema.dense_width > 0, "the data has no dense values");
    let reader = crate::data::Reader::spawn(files, crate::data::ReaderConfig::new(&schema, 4096));
    let progress = reader.progress();
    let mut acc = StatsAccumulator::default();
    for batch in reader {
        acc.add(&batch?);
        on_progress(progress.bytes.load(std::sync::atomic::Ordering::Relaxed));
    }
    anyhow::ensure!(acc.count > 0, "the files hold no samples");
    Ok(acc.stats())
}

/// `data` with the statistics of `files` filled in, when it scales its dense values and has
/// none yet (None: nothing to fill). Every trainer computing them over the same files gets the
/// same numbers.
pub fn fill_stats(
    data: &crate::data::DataConfig,
    files: &[std::path::PathBuf],
    shorthand: Option<(usize, usize)>,
) -> anyhow::Result<Option<crate::data::DataConfig>> {
    if !data.needs_stats() || files.is_empty() {
        return Ok(None);
    }
    tracing::info!(
        files = files.len(),
        "computing the dense statistics of the training files (set [data] dense_stats to skip)"
    );
    let stats = compute(files.to_vec(), data, shorthand, &|_| {})
        .map_err(|e| anyhow::anyhow!("[data] dense_transform: the training files' statistics: {e:#}"))?;
    Ok(Some(crate::data::DataConfig { dense_stats: Some(StatsSource::Inline(stats)), ..data.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_and_both_scalings_by_hand() {
        let mut b = Batch::new(1, 2, 0);
        b.labels.extend([0.0, 1.0, 0.0]);
        b.dense.extend([1.0, 5.0, 3.0, 5.0, 5.0, 5.0]);
        let mut acc = StatsAccumulator::default();
        acc.add(&b);
        let s = acc.stats();
        assert_eq!(
            (s.count, s.mean.clone(), s.min.clone(), s.max.clone()),
            (3, vec![3.0, 5.0], vec![1.0, 5.0], vec![5.0, 5.0])
        );
        assert!((s.std[0] - (8.0f64 / 3.0).sqrt()).abs() < 1e-12 && s.std[1] == 0.0);
        let std = Affine::new(DenseTransform::Standardize, &s, 2).unwrap().unwrap();
        let mut v = vec![1.0, 5.0];
        std.apply(&mut v);
        assert!((v[0] + 2.0 / (8.0f32 / 3.0).sqrt()).abs() < 1e-6 && v[1] == 0.0, "{v:?}: a constant is only shifted");
        let mm = Affine::new(DenseTransform::Minmax, &s, 2).unwrap().unwrap();
        let mut v = vec![3.0, 5.0, 5.0, 5.0];
        mm.apply(&mut v);
        assert_eq!(v, [0.5, 0.0, 1.0, 0.0]);
        assert!(Affine::new(DenseTransform::Standardize, &s, 3).unwrap_err().contains("3 dense values"));
        let nan = DenseStats { mean: vec![f64::NAN, 0.0], ..s.clone() };
        assert!(Affine::new(DenseTransform::Minmax, &nan, 2).unwrap_err().contains("finite"));
        // Statistics no data gives (an edited file's): refused, naming the value.
        let negative = DenseStats { std: vec![1.0, -1.0], ..s.clone() };
        let err = Affine::new(DenseTransform::Standardize, &negative, 2).unwrap_err();
        assert!(err.contains("std of dense value 2 is -1, below 0"), "{err}");
        let crossed = DenseStats { min: vec![5.0, 5.0], max: vec![-5.0, 5.0], ..s.clone() };
        let err = Affine::new(DenseTransform::Minmax, &crossed, 2).unwrap_err();
        assert!(err.contains("dense value 1's min 5 is above its max -5"), "{err}");
        let nothing = DenseStats { count: 0, ..s.clone() };
        assert!(Affine::new(DenseTransform::Minmax, &nothing, 2).unwrap_err().contains("0 samples"));
        let huge = DenseStats { mean: vec![1e300, 0.0], ..s };
        let err = Affine::new(DenseTransform::Standardize, &huge, 2).unwrap_err();
        assert!(err.contains("(1e300) is not a finite 32-bit number"), "{err}");
        // No dense values: empty statistics fit them, but there is nothing to scale (the
        // reader thread panicked dividing rows by a width of 0).
        let none = DenseStats { count: 0, mean: vec![], std: vec![], min: vec![], max: vec![] };
        let err = Affine::new(DenseTransform::Standardize, &none, 0).unwrap_err();
        assert!(err.contains("no dense values to scale"), "{err}");
    }
}
