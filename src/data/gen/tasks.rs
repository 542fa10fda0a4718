//! `oar gen tasks`: two binary tasks over the same 100 dense inputs whose relation is set by
//! `--correlation`, in one of two planted forms ([`Effect`]). Built like [`crate::data::gen`]: every
//! draw a pure function of (seed, stream, line); `meta.json` has the planted model's test AUC of
//! each task.
//!
//! Inputs `x`: 100 independent standard normals. Each task's score `s_t` is standardized with its
//! mean and standard deviation over 10,000 lines of a separate stream, and
//! `label_t ~ Bernoulli(sigmoid(k z_t))`, `z_t` the standardized score, `k` the sharpness
//! (`--sharpness`, 3 unless asked: the higher, the less label noise).
//!
//! - `--effect sines`, the synthetic setting of the MMoE paper (Ma et al., KDD 2018, section
//!   4.1) with its regression labels turned into clicks: two orthogonal unit vectors `u1`, `u2`,
//!   `w1 = u1` and `w2 = r u1 + sqrt(1 - r^2) u2` (the tasks' linear parts correlated `r`);
//!   `s_t = w_t . x + sum over m terms of sin(a_i w_t . x + b_i)` (`a_i`, `b_i` standard
//!   normals shared by the tasks, as in the paper; `m = --sines`, 10 as in the paper unless
//!   asked). The paper found a shared bottom losing to
//!   MMoE's gates as the correlation falls; not reproduced here (docs/src/measurements/2026-11-models.md, "A task relation").
//! - `--effect experts`, a planted mixture of experts: 4 shared experts, each a linear function
//!   `v_k . x` (unit `v_k`), mixed per task by a softmax gate over `2 G_t x` (`G_t`: 4 unit rows;
//!   task 2's rows are `r` times task 1's plus `sqrt(1 - r^2)` times fresh unit draws,
//!   normalized; the draws are not made orthogonal, so the rows' cosine is only about `r`):
//!   `s_t = sum_k softmax(2 G_t x)_k v_k . x`. The tasks share what is computed but weigh it by
//!   the input, differently: the relation MMoE's gates are built for, and a product of the
//!   input with itself that a shared ReLU bottom can only approximate.
//! - `--effect wiggle`: the linear parts of `sines`, each task with one sine of its own
//!   projection, `s_t = w_t . x + sin(6 w_t . x + b_t)` (the frequency times `--frequency`;
//!   `b_t` uniform in [0, 2 pi), drawn per task). A function that wiggles that fast where the
//!   data is dense is learned in a few passes by PLE's two levels of experts but not by a
//!   shared bottom's one layer or MMoE's (docs/src/measurements/2026-11-models.md, "A function that wiggles"): on every planted
//!   draw, where the paper's sines part the models on some draws only.
//!
//! A line is plain text: `label1 label2 x1 .. x100` (the `plain` format; `meta.json` has the
//! `[data]` section).

use std::io::Write;

use serde::Serialize;

use crate::base::layout::mix64;
use crate::data::gen::{sigmoid, write_meta, write_parts, Draws, GenConfig, GenReport};

/// Dense inputs per line.
pub const INPUTS: usize = 100;
/// Sine terms per score unless asked (the paper's).
pub const SINES: usize = 10;
/// The most sine terms: their draws come before the experts' (from `4 INPUTS` on).
pub const MOST_SINES: usize = INPUTS;
/// Slope of the click probability in the standardized score unless asked.
pub const SHARPNESS: f64 = 3.0;
/// The sine's frequency of `--effect wiggle` (times `--frequency`).
pub const WIGGLE_FREQUENCY: f64 = 6.0;
/// Lines of stream 3 that fix each score's mean and standard deviation.
const CALIBRATION_LINES: u64 = 10_000;

/// Planted experts of `--effect experts`.
pub const EXPERTS: usize = 4;
/// Sharpness of the planted gates of `--effect experts`.
pub const GATE_SHARPNESS: f64 = 2.0;

/// Which planted task relation `oar gen tasks` writes (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Effect {
    /// The MMoE paper's: a linear part and 10 sines of it per task.
    #[default]
    Sines,
    /// A planted mixture of 4 linear experts with a softmax gate per task.
    Experts,
    /// Each task's linear part and one sine of it, of frequency 6 and a phase of its own.
    Wiggle,
}

/// What `oar gen tasks` plants: the relation, the tasks' correlation, the sine terms of
/// `--effect sines` and the labels' sharpness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Relation {
    /// The planted relation.
    pub effect: Effect,
    /// In [-1, 1]: of the linear parts (`sines`), about that of the gates' rows (`experts`).
    pub correlation: f64,
    /// Sine terms per score (`sines`), 1 to [`MOST_SINES`].
    pub sines: usize,
    /// Slope of the click probability in the standardized score, in (0, 100].
    pub sharpness: f64,
    /// Multiplies every sine's frequency `a_i` (`sines`), in (0, 10]: 1 is the paper's. With
    /// `a_i` standard normals, how finely a draw's score wiggles is luck (planted draw 5 of 20
    /// sines drew two near 2.5, and only there did PLE lead the shared bottom); a frequency of
    /// 3 gives every draw such structure.
    pub frequency: f64,
}

impl Relation {
    /// `effect` at `correlation`, with the paper's 10 sines and sharpness 3.
    pub fn new(effect: Effect, correlation: f64) -> Relation {
        Relation { effect, correlation, sines: SINES, sharpness: SHARPNESS, frequency: 1.0 }
    }

    fn check(&self) -> anyhow::Result<()> {
        let Relation { correlation, sines, sharpness, frequency, .. } = *self;
        anyhow::ensure!((-1.0..=1.0).contains(&correlation), "--correlation must be in [-1, 1], got {correlation}");
        anyhow::ensure!((1..=MOST_SINES).contains(&sines), "--sines must be 1 to {MOST_SINES}, got {sines}");
        anyhow::ensure!(sharpness > 0.0 && sharpness <= 100.0, "--sharpness must be in (0, 100], got {sharpness}");
        anyhow::ensure!(frequency > 0.0 && frequency <= 10.0, "--frequency must be in (0, 10], got {frequency}");
        Ok(())
    }
}

/// The planted experts and gates of `--effect experts`.
#[derive(Clone, Debug)]
struct Mixture {
    experts: [[f64; INPUTS]; EXPERTS],
    gates: [[[f64; INPUTS]; EXPERTS]; 2],
}

/// The planted model of one seed, effect and correlation.
#[derive(Clone, Debug)]
struct Planted {
    w: [[f64; INPUTS]; 2],
    sines: Vec<(f64, f64)>,
    sharpness: f64,
    /// `Some` for `--effect experts`, which then ignores `w` and `sines`.
    mixture: Option<Mixture>,
    /// `Some` for `--effect wiggle`: each task's one sine (frequency, phase), in place of `sines`.
    wiggles: Option<[(f64, f64); 2]>,
    /// Each task's score mean and standard deviation.
    scale: [(f64, f64); 2],
}

fn unit(v: &mut [f64; INPUTS]) {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
}

fn dot(a: &[f64; INPUTS], b: &[f64; INPUTS]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Mixture {
    /// Draws after the sines' draws (`d`'s indices from `4 INPUTS` on), so `--effect sines`
    /// keeps the data it wrote before this effect existed.
    fn new(d: &Draws, correlation: f64) -> Mixture {
        let r = correlation;
        let vector = |k: usize| {
            let mut v: [f64; INPUTS] = std::array::from_fn(|i| d.normal(((4 + k) * INPUTS + i) as u64));
            unit(&mut v);
            v
        };
        let experts = std::array::from_fn(vector);
        let first: [[f64; INPUTS]; EXPERTS] = std::array::from_fn(|k| vector(EXPERTS + k));
        let second = std::array::from_fn(|k| {
            let fresh = vector(2 * EXPERTS + k);
            let mut g: [f64; INPUTS] = std::array::from_fn(|i| r * first[k][i] + (1.0 - r * r).sqrt() * fresh[i]);
            unit(&mut g);
            g
        });
        Mixture { experts, gates: [first, second] }
    }

    /// Each task's mixture of the experts at inputs `x`.
    fn scores(&self, x: &[f64; INPUTS]) -> [f64; 2] {
        let h = self.experts.map(|v| dot(&v, x));
        self.gates.map(|g| {
            let a = g.map(|row| GATE_SHARPNESS * dot(&row, x));
            let top = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e = a.map(|v| (v - top).exp());
            e.iter().zip(&h).map(|(e, h)| e * h).sum::<f64>() / e.iter().sum::<f64>()
        })
    }
}

impl Planted {
    fn new(seed: u64, relation: &Relation) -> Planted {
        let Relation { effect, correlation, .. } = *relation;
        let d = Draws { base: mix64(seed ^ 0x7a5c) };
        let mut u1 = [0.0; INPUTS];
        let mut u2 = [0.0; INPUTS];
        for k in 0..INPUTS {
            u1[k] = d.normal(k as u64);
            u2[k] = d.normal((INPUTS + k) as u64);
        }
        unit(&mut u1);
        // Gram-Schmidt: u2 orthogonal to u1.
        let dot: f64 = u1.iter().zip(&u2).map(|(a, b)| a * b).sum();
        u2.iter_mut().zip(&u1).for_each(|(b, a)| *b -= dot * a);
        unit(&mut u2);
        let r = correlation;
        let mut w2 = [0.0; INPUTS];
        for k in 0..INPUTS {
            w2[k] = r * u1[k] + (1.0 - r * r).sqrt() * u2[k];
        }
        let sines = (0..relation.sines)
            .map(|i| {
                let (a, b) = (d.normal((2 * INPUTS + 2 * i) as u64), d.normal((2 * INPUTS + 2 * i + 1) as u64));
                (relation.frequency * a, b)
            })
            .collect();
        let mixture = (effect == Effect::Experts).then(|| Mixture::new(&d, correlation));
        // Drawn after the experts' (d's indices from 16 INPUTS on), so the other effects keep
        // the data they wrote before this one existed.
        let wiggles = (effect == Effect::Wiggle).then(|| {
            let a = WIGGLE_FREQUENCY * relation.frequency;
            [0, 1].map(|t| (a, std::f64::consts::TAU * d.uniform((16 * INPUTS + t) as u64)))
        });
        let sharpness = relation.sharpness;
        let mut planted = Planted { w: [u1, w2], sines, sharpness, mixture, wiggles, scale: [(0.0, 1.0); 2] };
        let mut sums = [(0.0, 0.0); 2];
        for line in 0..CALIBRATION_LINES {
            let s = planted.scores(&inputs(seed, 3, line));
            for k in 0..2 {
                sums[k].0 += s[k];
                sums[k].1 += s[k] * s[k];
            }
        }
        let n = CALIBRATION_LINES as f64;
        planted.scale = sums.map(|(s, q)| (s / n, (q / n - (s / n).powi(2)).sqrt()));
        planted
    }

    /// Each task's raw score of inputs `x`.
    fn scores(&self, x: &[f64; INPUTS]) -> [f64; 2] {
        if let Some(m) = &self.mixture {
            return m.scores(x);
        }
        let z = self.w.map(|w| dot(&w, x));
        if let Some(wiggles) = self.wiggles {
            return [0, 1].map(|t| z[t] + (wiggles[t].0 * z[t] + wiggles[t].1).sin());
        }
        z.map(|z| z + self.sines.iter().map(|(a, b)| (a * z + b).sin()).sum::<f64>())
    }

    /// Each task's click probability of inputs `x`.
    fn probabilities(&self, x: &[f64; INPUTS]) -> [f64; 2] {
        let s = self.scores(x);
        [0, 1].map(|k| sigmoid(self.sharpness * (s[k] - self.scale[k].0) / self.scale[k].1))
    }
}

/// The inputs of line `line` of `stream`.
fn inputs(seed: u64, stream: u64, line: u64) -> [f64; INPUTS] {
    let d = Draws::new(seed ^ 0x7a5c, stream, line);
    std::array::from_fn(|k| d.normal(k as u64))
}

/// What `oar gen tasks` wrote: the usual report (labels: the first task's) and the planted
/// model.
#[derive(Clone, Debug, Serialize)]
pub struct TasksGenReport {
    /// Lines, the first task's positive rate, its planted test AUC and log-loss.
    #[serde(flatten)]
    pub report: GenReport,
    /// The planted model's constants and each task's test AUC.
    pub planted: serde_json::Value,
    /// The `[data]` section that reads the files.
    pub data: serde_json::Value,
}

/// Line `line` of `stream`: its inputs, each task's click probability and label.
fn sample(planted: &Planted, seed: u64, stream: u64, line: u64) -> ([f64; INPUTS], [f64; 2], [f32; 2]) {
    let x = inputs(seed, stream, line);
    let p = planted.probabilities(&x);
    let d = Draws::new(seed ^ 0x7a5c, stream, line);
    (x, p, [0, 1].map(|k| (d.uniform(1000 + k as u64) < p[k]) as u8 as f32))
}

/// Writes line `line` of `stream` into `out`; returns the first task's label and probability.
fn write_line(planted: &Planted, seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let (x, p, labels) = sample(planted, seed, stream, line);
    let w = |r: std::io::Result<()>| r.expect("writing to a Vec cannot fail");
    w(write!(out, "{} {}", labels[0], labels[1]));
    for v in x {
        w(write!(out, " {v:.4}"));
    }
    out.push(b'\n');
    (labels[0], p[0])
}

/// Generates the data set described by `config`: tasks related as `relation` says.
pub fn generate(config: &GenConfig, relation: &Relation) -> anyhow::Result<TasksGenReport> {
    relation.check()?;
    let Relation { effect, correlation, sines, sharpness, frequency } = *relation;
    let planted = Planted::new(config.seed, relation);
    let report = write_parts(config, &|seed, stream, line, out| write_line(&planted, seed, stream, line, out))?;
    // The second task's planted AUC on the test lines (the report's is the first task's).
    let (labels, probs): (Vec<f32>, Vec<f32>) = (0..config.test_lines)
        .map(|line| {
            let (_, p, y) = sample(&planted, config.seed, 2, line);
            (y[1], p[1] as f32)
        })
        .unzip();
    let planted_json = serde_json::json!({
        "correlation": correlation,
        "effect": format!("{effect:?}").to_lowercase(),
        "inputs": INPUTS,
        "sines": sines,
        "experts": EXPERTS,
        "gate_sharpness": GATE_SHARPNESS,
        "sharpness": sharpness,
        "frequency": frequency,
        "wiggles": planted.wiggles,
        "oracle_test_auc": [report.oracle_test_auc, crate::observe::metrics::auc(&probs, &labels)],
        "format": "plain: task1 task2 x1 .. x100",
    });
    let data = serde_json::json!({
        "format": "plain",
        "labels": ["task1", "task2"],
        "dense": [{ "name": "x", "width": INPUTS }],
        "slots": [],
    });
    let r = TasksGenReport { report, planted: planted_json, data };
    write_meta(config, &r)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wiggle_is_each_tasks_own_sine_of_its_projection() {
        let p = Planted::new(3, &Relation { sharpness: 10.0, ..Relation::new(Effect::Wiggle, 0.5) });
        let faster = Planted::new(3, &Relation { frequency: 0.5, ..Relation::new(Effect::Wiggle, 0.5) });
        let [(a1, b1), (a2, b2)] = p.wiggles.unwrap();
        assert_eq!((a1, a2), (WIGGLE_FREQUENCY, WIGGLE_FREQUENCY));
        assert_eq!(faster.wiggles.unwrap()[0], (3.0, b1));
        assert!(b1 != b2 && (0.0..std::f64::consts::TAU).contains(&b1) && (0.0..std::f64::consts::TAU).contains(&b2));
        let x = inputs(3, 0, 17);
        let z = p.w.map(|w| dot(&w, &x));
        assert_eq!(p.scores(&x), [z[0] + (6.0 * z[0] + b1).sin(), z[1] + (6.0 * z[1] + b2).sin()]);
        // The linear parts are the sines effect's, whose data stays as it was.
        assert_eq!(p.w, Planted::new(3, &Relation::new(Effect::Sines, 0.5)).w);
    }

    #[test]
    fn the_tasks_linear_parts_have_the_asked_correlation() {
        for r in [0.0, 0.5, -0.9, 1.0] {
            let p = Planted::new(4, &Relation::new(Effect::Sines, r));
            assert!((dot(&p.w[0], &p.w[0]) - 1.0).abs() < 1e-12 && (dot(&p.w[1], &p.w[1]) - 1.0).abs() < 1e-12);
            assert!((dot(&p.w[0], &p.w[1]) - r).abs() < 1e-12, "r {r}");
            // Standardized scores: mean 0 and standard deviation 1 on the calibration stream.
            assert!(p.scale.iter().all(|&(_, sd)| sd > 0.1));
        }
        // Equal tasks at correlation 1: the same probabilities.
        let p = Planted::new(4, &Relation::new(Effect::Sines, 1.0));
        let x = inputs(4, 1, 9);
        let q = p.probabilities(&x);
        assert!((q[0] - q[1]).abs() < 1e-9);
    }

    #[test]
    fn more_sines_and_a_sharper_slope_are_the_same_formula_with_other_constants() {
        let paper = Planted::new(5, &Relation::new(Effect::Sines, 0.5));
        let asked = Planted::new(5, &Relation { sines: 20, sharpness: 10.0, ..Relation::new(Effect::Sines, 0.5) });
        // The first 10 sine terms are the paper's draws, the next 10 new ones.
        assert_eq!((paper.sines.len(), asked.sines.len()), (10, 20));
        assert_eq!(paper.sines[..], asked.sines[..10]);
        assert_eq!(paper.w, asked.w);
        // A frequency multiplies each a_i, nothing else.
        let faster = Planted::new(5, &Relation { frequency: 3.0, ..Relation::new(Effect::Sines, 0.5) });
        assert!(faster.sines.iter().zip(&paper.sines).all(|(f, p)| f.0 == 3.0 * p.0 && f.1 == p.1));
        assert_eq!(faster.w, paper.w);
        // By hand at one line: the score, then sigmoid(10 z) of the standardized score.
        let x = inputs(5, 1, 3);
        for t in 0..2 {
            let z = dot(&asked.w[t], &x);
            let s = z + asked.sines.iter().map(|(a, b)| (a * z + b).sin()).sum::<f64>();
            let (mean, sd) = asked.scale[t];
            let want = 1.0 / (1.0 + (-10.0 * (s - mean) / sd).exp());
            assert!((asked.probabilities(&x)[t] - want).abs() < 1e-12);
        }
    }

    #[test]
    fn lines_are_reproducible_plain_text_with_two_labels_and_the_inputs() {
        let planted = Planted::new(2, &Relation::new(Effect::Sines, 0.0));
        let (mut a, mut b, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for line in 0..300 {
            write_line(&planted, 2, 1, line, &mut a);
            write_line(&planted, 2, 1, line, &mut b);
            labels.push(sample(&planted, 2, 1, line).2);
        }
        assert_eq!(a, b);
        let text = String::from_utf8(a).unwrap();
        for (line, y) in text.lines().zip(&labels) {
            let v: Vec<f64> = line.split(' ').map(|t| t.parse().unwrap()).collect();
            assert_eq!(v.len(), 2 + INPUTS);
            assert_eq!([v[0] as f32, v[1] as f32], *y);
        }
        let dir = tempfile::tempdir().unwrap();
        let config = GenConfig { lines: 1, test_lines: 1, seed: 1, parts: 1, out: dir.path().into() };
        let sines = Relation::new(Effect::Sines, 0.0);
        for (bad, says) in [
            (Relation { correlation: 1.5, ..sines }, "--correlation must be in [-1, 1], got 1.5"),
            (Relation { sines: 0, ..sines }, "--sines must be 1 to 100, got 0"),
            (Relation { sines: 101, ..sines }, "--sines must be 1 to 100, got 101"),
            (Relation { sharpness: f64::NAN, ..sines }, "--sharpness must be in (0, 100], got NaN"),
            (Relation { sharpness: 0.0, ..sines }, "--sharpness must be in (0, 100], got 0"),
            (Relation { frequency: 0.0, ..sines }, "--frequency must be in (0, 10], got 0"),
            (Relation { frequency: f64::INFINITY, ..sines }, "--frequency must be in (0, 10], got inf"),
        ] {
            assert_eq!(generate(&config, &bad).unwrap_err().to_string(), says);
        }
    }

    #[test]
    fn the_experts_effect_mixes_four_linear_experts_by_each_tasks_softmax_gate() {
        let p = Planted::new(3, &Relation::new(Effect::Experts, 0.0));
        let m = p.mixture.as_ref().unwrap();
        let x = inputs(3, 1, 5);
        // By hand: softmax weights of 2 G_t x, then the weighted sum of v_k . x.
        let s = m.scores(&x);
        for (t, gate) in m.gates.iter().enumerate() {
            let a: Vec<f64> = gate.iter().map(|row| 2.0 * dot(row, &x)).collect();
            let z: f64 = a.iter().map(|v| v.exp()).sum();
            let want: f64 = (0..EXPERTS).map(|k| a[k].exp() / z * dot(&m.experts[k], &x)).sum();
            assert!((s[t] - want).abs() < 1e-9, "task {t}: {} against {want}", s[t]);
            let h: Vec<f64> = m.experts.iter().map(|v| dot(v, &x)).collect();
            assert!(h.iter().any(|&h| h <= s[t]) && h.iter().any(|&h| h >= s[t]), "a mixture lies among its experts");
        }
        // Independent gates at correlation 0 weigh the experts differently...
        assert!((s[0] - s[1]).abs() > 1e-6);
        // ...and equal gates at correlation 1 give equal tasks.
        let q = Planted::new(3, &Relation::new(Effect::Experts, 1.0));
        let x = inputs(3, 1, 9);
        let pr = q.probabilities(&x);
        assert!((pr[0] - pr[1]).abs() < 1e-9);
        // Every direction is a unit vector.
        let m = q.mixture.unwrap();
        for v in m.experts.iter().chain(m.gates.iter().flatten()) {
            assert!((dot(v, v) - 1.0).abs() < 1e-12);
        }
        // The sines effect still writes what it wrote before the experts existed.
        assert_eq!(
            Planted::new(3, &Relation::new(Effect::Sines, 0.0)).w,
            Planted::new(3, &Relation::new(Effect::Experts, 0.0)).w
        );
    }
}
