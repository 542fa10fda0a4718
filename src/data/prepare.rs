//! Turns the seed examples' raw data sets into [`super::format::plain`] train/test files, the way
//! PaddlePaddle's `paddle.dataset` modules prepare them (UCI housing, [`uci_housing`], and the
//! PTB N-grams of `imikolov`, [`imikolov`]), and computes the simple baselines the trained models
//! are judged against.

use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::fetch::MAX_FILE_BYTES;

/// What a preparation wrote and the baselines it measured.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The train file.
    pub train: PathBuf,
    /// The test file.
    pub test: PathBuf,
    /// Train and test samples.
    pub samples: (usize, usize),
    /// Baselines on the test file, each named.
    pub baselines: Vec<(String, f64)>,
    /// Dictionary file and size (N-gram data only).
    pub dict: Option<(PathBuf, usize)>,
}

/// Opens a text file, transparently gunzipping a `.gz` one; a missing `x.txt` is also looked
/// for as `x.txt.gz`. Only a regular file (a named pipe waited for ever, `/dev/zero` grew memory
/// without end), and at most [`MAX_FILE_BYTES`] once unpacked: the raw sets are a few MiB.
fn open_text(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    let gz = path.with_file_name(format!("{}.gz", path.file_name().unwrap_or_default().to_string_lossy()));
    let (path, zipped) = if !path.exists() && gz.exists() { (gz.as_path(), true) } else { (path, false) };
    let file = super::read::files::open_regular(path).with_context(|| format!("cannot open {}", path.display()))?;
    let zipped = zipped || path.extension().is_some_and(|e| e == "gz");
    let read: Box<dyn Read> = if zipped { Box::new(flate2::read::MultiGzDecoder::new(file)) } else { Box::new(file) };
    Ok(Box::new(std::io::BufReader::new(Bounded { read, left: MAX_FILE_BYTES, path: path.to_path_buf() })))
}

/// A reader that fails, naming its file, past `left` bytes.
struct Bounded {
    read: Box<dyn Read>,
    left: u64,
    path: std::path::PathBuf,
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.read.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            let what = format!("{}: more than {} MiB: not this data set", self.path.display(), MAX_FILE_BYTES >> 20);
            std::io::Error::new(std::io::ErrorKind::InvalidData, what)
        })?;
        Ok(n)
    }
}

fn create(path: &Path) -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
    let f = crate::base::state_file::create_plain(path)?;
    Ok(std::io::BufWriter::new(f))
}

/// UCI housing as `paddle.dataset.uci_housing`: 14 whitespace-separated columns (13 features,
/// the price last); every feature becomes `(x - mean) / (max - min)` over all rows; the first
/// `int(0.8 n)` rows are train, the rest test. Writes `train.txt` and `test.txt` (`price f1..f13`)
/// into `out`. Baselines: the train mean, and closed-form least squares fitted on train.
pub fn uci_housing(src: &Path, out: &Path) -> anyhow::Result<Prepared> {
    const COLS: usize = 14;
    let mut rows: Vec<[f64; COLS]> = Vec::new();
    for (n, line) in open_text(src)?.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", src.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut row = [0.0f64; COLS];
        let mut fields = line.split_ascii_whitespace();
        for (c, v) in row.iter_mut().enumerate() {
            let f = fields.next().with_context(|| format!("{}:{}: {COLS} columns expected", src.display(), n + 1))?;
            *v = f
                .parse()
                .with_context(|| format!("{}:{}: column {} is not a number: {f:?}", src.display(), n + 1, c + 1))?;
            // A NaN, an infinity or a sum past f64 made every row's column NaN, and exit 0.
            anyhow::ensure!(
                v.abs() <= f64::from(super::MAX_VALUE),
                "{}:{}: column {} is {f:?}, not a number within +-{:e}",
                src.display(),
                n + 1,
                c + 1,
                super::MAX_VALUE
            );
        }
        anyhow::ensure!(fields.next().is_none(), "{}:{}: more than {COLS} columns", src.display(), n + 1);
        rows.push(row);
    }
    anyhow::ensure!(rows.len() >= 5, "{}: only {} rows", src.display(), rows.len());
    for c in 0..COLS - 1 {
        let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
        for r in &rows {
            lo = lo.min(r[c]);
            hi = hi.max(r[c]);
            sum += r[c];
        }
        let (mean, range) = (sum / rows.len() as f64, (hi - lo).max(f64::MIN_POSITIVE));
        rows.iter_mut().for_each(|r| r[c] = (r[c] - mean) / range);
    }
    let split = rows.len() * 8 / 10;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let (train, test) = (out.join("train.txt"), out.join("test.txt"));
    for (path, part) in [(&train, &rows[..split]), (&test, &rows[split..])] {
        let mut w = create(path)?;
        for r in part {
            write!(w, "{}", r[COLS - 1])?;
            r[..COLS - 1].iter().try_for_each(|v| write!(w, " {v}"))?;
            writeln!(w)?;
        }
        w.flush().with_context(|| format!("cannot write {}", path.display()))?;
    }
    let (fit, held) = (&rows[..split], &rows[split..]);
    let mean = fit.iter().map(|r| r[COLS - 1]).sum::<f64>() / fit.len() as f64;
    let mse = |predict: &dyn Fn(&[f64; COLS]) -> f64| {
        held.iter().map(|r| (predict(r) - r[COLS - 1]).powi(2)).sum::<f64>() / held.len() as f64
    };
    let w = least_squares(fit);
    let linear = |r: &[f64; COLS]| w[COLS - 1] + (0..COLS - 1).map(|c| w[c] * r[c]).sum::<f64>();
    Ok(Prepared {
        train,
        test,
        samples: (fit.len(), held.len()),
        baselines: vec![
            ("closed-form least squares test MSE".into(), mse(&linear)),
            ("train-mean predictor test MSE".into(), mse(&|_| mean)),
        ],
        dict: None,
    })
}

/// Least-squares weights (13 features then the bias) by the normal equations, solved by
/// Gaussian elimination with partial pivoting.
#[allow(clippy::needless_range_loop)] // row operations read two rows of the same matrix
fn least_squares(rows: &[[f64; 14]]) -> [f64; 14] {
    const K: usize = 14;
    let mut a = [[0.0f64; K + 1]; K];
    for r in rows {
        let x: Vec<f64> = r[..K - 1].iter().copied().chain([1.0]).collect();
        for i in 0..K {
            for j in 0..K {
                a[i][j] += x[i] * x[j];
            }
            a[i][K] += x[i] * r[K - 1];
        }
    }
    for col in 0..K {
        let pivot = (col..K).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs())).unwrap_or(col);
        a.swap(col, pivot);
        for i in 0..K {
            if i != col && a[col][col] != 0.0 {
                let f = a[i][col] / a[col][col];
                for j in col..=K {
                    a[i][j] -= f * a[col][j];
                }
            }
        }
    }
    let mut w = [0.0; K];
    for i in 0..K {
        w[i] = if a[i][i] != 0.0 { a[i][K] / a[i][i] } else { 0.0 };
    }
    w
}

/// The word dictionary of `paddle.dataset.imikolov.build_dict`: words counted over `files`,
/// each line also counting one `<s>` and one `<e>`; `<unk>` dropped; words seen more than
/// `min_count` times, sorted by (count descending, word); `<unk>` appended last.
pub fn build_dict(files: &[PathBuf], min_count: u64) -> anyhow::Result<Vec<String>> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    for path in files {
        for line in open_text(path)?.lines() {
            let line = line.with_context(|| format!("cannot read {}", path.display()))?;
            for w in line.split_ascii_whitespace() {
                *counts.entry(w.to_string()).or_default() += 1;
            }
            *counts.entry("<s>".into()).or_default() += 1;
            *counts.entry("<e>".into()).or_default() += 1;
        }
    }
    counts.remove("<unk>");
    let mut words: Vec<(String, u64)> = counts.into_iter().filter(|(_, c)| *c > min_count).collect();
    words.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut dict: Vec<String> = words.into_iter().map(|(w, _)| w).collect();
    dict.push("<unk>".into());
    Ok(dict)
}

/// The `n`-grams of `paddle.dataset.imikolov` (`DataType.NGRAM`) of one file, each given to
/// `each` as it is made: every line becomes `<s> words <e>`, words outside the dictionary
/// become `<unk>`, and every window of `n` consecutive words is one sample (lines shorter than
/// `n` give none). Returns how many there were. Streamed: kept as a list, the samples took 42
/// times the file's size, and a large `n` aborted the process on allocation.
fn ngrams(
    path: &Path,
    index: &HashMap<&str, u64>,
    unk: u64,
    n: usize,
    mut each: impl FnMut(&[u64]) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut count = 0;
    let mut ids = Vec::new();
    for line in open_text(path)?.lines() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        ids.clear();
        ids.extend(
            std::iter::once("<s>")
                .chain(line.split_ascii_whitespace())
                .chain(std::iter::once("<e>"))
                .map(|w| index.get(w).copied().unwrap_or(unk)),
        );
        for window in ids.windows(n) {
            each(window)?;
            count += 1;
        }
    }
    Ok(count)
}

/// Largest `n` of `oar data prepare imikolov` (Paddle's examples use 5).
pub const MAX_NGRAM: usize = 64;

/// PTB as `paddle.dataset.imikolov`: the dictionary of [`build_dict`] over `ptb.train.txt` and
/// `ptb.valid.txt` in `src` (`.gz` accepted), `n`-gram samples of `ptb.train.txt` (train) and of
/// `ptb.valid.txt` (test, as Paddle's `imikolov.test()`), written as `next_word w1 .. w{n-1}`
/// with `dict.txt` (one word per line, the line number is the id). Baseline: an add-one
/// smoothed bigram model fitted on the train samples, its perplexity on the test samples'
/// last words.
pub fn imikolov(src: &Path, out: &Path, min_count: u64, n: usize) -> anyhow::Result<Prepared> {
    anyhow::ensure!((2..=MAX_NGRAM).contains(&n), "--n must be in 2..={MAX_NGRAM}, not {n}");
    let (train_src, test_src) = (src.join("ptb.train.txt"), src.join("ptb.valid.txt"));
    let dict = build_dict(&[train_src.clone(), test_src.clone()], min_count)?;
    let index: HashMap<&str, u64> = dict.iter().enumerate().map(|(i, w)| (w.as_str(), i as u64)).collect();
    let unk = dict.len() as u64 - 1;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let dict_path = out.join("dict.txt");
    let mut w = create(&dict_path)?;
    dict.iter().try_for_each(|word| writeln!(w, "{word}"))?;
    w.flush().with_context(|| format!("cannot write {}", dict_path.display()))?;

    let (train, test) = (out.join("train.txt"), out.join("test.txt"));
    let v = dict.len() as f64;
    // The bigram baseline's counts over the train samples, then its loss on the test samples.
    let (mut pair, mut single): (HashMap<(u64, u64), u64>, HashMap<u64, u64>) = (HashMap::new(), HashMap::new());
    let mut nll = 0.0;
    let mut samples = [0u64; 2];
    for (k, (from, to)) in [(&train_src, &train), (&test_src, &test)].into_iter().enumerate() {
        let mut w = create(to)?;
        samples[k] = ngrams(from, &index, unk, n, |g| {
            write!(w, "{}", g[n - 1])?;
            g[..n - 1].iter().try_for_each(|id| write!(w, " {id}"))?;
            writeln!(w)?;
            let (prev, word) = (g[n - 2], g[n - 1]);
            if k == 0 {
                *pair.entry((prev, word)).or_default() += 1;
                *single.entry(prev).or_default() += 1;
            } else {
                let c = pair.get(&(prev, word)).copied().unwrap_or(0) as f64;
                let total = single.get(&prev).copied().unwrap_or(0) as f64;
                nll -= ((c + 1.0) / (total + v)).ln();
            }
            Ok(())
        })?;
        w.flush().with_context(|| format!("cannot write {}", to.display()))?;
        anyhow::ensure!(
            samples[k] > 0,
            "{}: no line holds {n} words with its start and end: no sample",
            from.display()
        );
    }
    Ok(Prepared {
        train,
        test,
        samples: (samples[0] as usize, samples[1] as usize),
        baselines: vec![("add-one bigram test perplexity".into(), (nll / samples[1] as f64).exp())],
        dict: Some((dict_path, dict.len())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_follows_paddles_rules() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.txt");
        std::fs::write(&a, " b a <unk> a \n c b a \n").unwrap();
        // Counts: a 3, b 2, c 1, <s> 2, <e> 2; <unk> dropped; > 1 kept; ties sorted by word.
        let dict = build_dict(&[a], 1).unwrap();
        assert_eq!(dict, ["a", "<e>", "<s>", "b", "<unk>"]);
    }

    #[test]
    fn ngrams_wrap_lines_in_start_and_end_marks() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.txt");
        std::fs::write(&a, " x y \n x \n").unwrap();
        let index: HashMap<&str, u64> = [("<s>", 0), ("<e>", 1), ("x", 2)].into_iter().collect();
        let mut grams = Vec::new();
        let count = ngrams(&a, &index, 9, 3, |g| {
            grams.push(g.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(grams, [vec![0, 2, 9], vec![2, 9, 1], vec![0, 2, 1]]);
        assert_eq!(count, 3);
    }

    #[test]
    fn an_n_past_the_bound_or_past_every_line_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ptb.train.txt"), "a b c\n").unwrap();
        std::fs::write(dir.path().join("ptb.valid.txt"), "a b\n").unwrap();
        let out = dir.path().join("out");
        let err = |n| imikolov(dir.path(), &out, 0, n).unwrap_err().to_string();
        assert!(err(100_000).contains("--n must be in 2..=64, not 100000"));
        assert!(err(usize::MAX).contains("--n must be in 2..=64"));
        // `<s> a b c <e>`: 5 words, so 6-grams there are none: an error, not a NaN perplexity.
        assert!(err(6).contains("ptb.train.txt: no line holds 6 words"), "{}", err(6));
        assert!(err(5).contains("ptb.valid.txt: no line holds 5 words"), "{}", err(5));
        assert_eq!(imikolov(dir.path(), &out, 0, 4).unwrap().samples, (2, 1));
    }
}
