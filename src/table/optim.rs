//! Optimizers as pure functions on slices: one row (or dense block) of weights, its optimizer
//! state, and a gradient. Nothing here knows about tables, servers or sockets.
//!
//! The update rules follow PyTorch's documented algorithms (`torch.optim.SGD`, `Adagrad`, `Adam`)
//! with L2 regularization added to the gradient (`weight_decay`), so results can be checked
//! against PyTorch. Gradients arrive as sums over a batch; `scale` (1 / samples) turns them into
//! the batch mean before the update. Sparse tables may instead run PaddlePaddle's own rules
//! ([`super::paddle_rules`]), with Paddle's defaults, and the dense parameters Paddle's
//! `DAdamD2Sum` (`adam_d2sum`), the dense Adam of its parameter-server mode. Settings a job file
//! leaves out take the rule's own defaults.

use serde::{Deserialize, Serialize};

/// Which update rule a table uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Plain stochastic gradient descent.
    Sgd,
    /// Adagrad with a per-element accumulator of squared gradients.
    Adagrad,
    /// Adam with bias correction.
    Adam,
    /// Paddle's `SparseNaiveSGDRule` (sparse tables).
    #[serde(alias = "SparseNaiveSGDRule")]
    SparseNaive,
    /// Paddle's `SparseAdaGradSGDRule`: one accumulator per row (sparse tables).
    #[serde(alias = "SparseAdaGradSGDRule")]
    SparseAdagrad,
    /// Paddle's `StdAdaGradSGDRule`: one accumulator per weight (sparse tables).
    #[serde(alias = "StdAdaGradSGDRule")]
    StdAdagrad,
    /// Paddle's `SparseAdamSGDRule` (sparse tables).
    #[serde(alias = "SparseAdamSGDRule")]
    SparseAdam,
    /// Paddle's `SparseSharedAdamSGDRule`: one moment pair per row (sparse tables).
    #[serde(alias = "SparseSharedAdamSGDRule")]
    SparseSharedAdam,
    /// Paddle's dense `DAdamD2Sum`, what its parameter-server mode runs for a dense Adam when
    /// `strategy.adam_d2sum` is set (PaddleRec's PS trainer sets it by default): a momentum
    /// (`beta1`, default 0.99) scaled per weight by `sqrt(d2sum / g2sum)`, the decayed counts of
    /// updates and of squared gradients (`beta2`, default 0.9999), without bias correction.
    /// Dense parameters only.
    #[serde(rename = "adam_d2sum", alias = "DAdamD2Sum")]
    #[value(name = "adam_d2sum", alias = "adam-d2sum")]
    AdamD2Sum,
    /// What GEO-SGD's servers run (Paddle's `sum` accessor): a push is a change to the weights,
    /// added as it is; the trainers run the job's optimizer on their own copies. Set by
    /// `--mode geo`, never named by a job file.
    #[value(skip)]
    Sum,
}

impl OptimizerKind {
    /// Whether this is one of Paddle's sparse rules.
    pub fn is_paddle(self) -> bool {
        !matches!(
            self,
            OptimizerKind::Sgd
                | OptimizerKind::Adagrad
                | OptimizerKind::Adam
                | OptimizerKind::AdamD2Sum
                | OptimizerKind::Sum
        )
    }
}

/// An optimizer with its hyper-parameters; the same struct configures dense and sparse tables.
/// Settings left out of a job file take the rule's defaults (Paddle's for its rules).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "OptimizerFields")]
pub struct Optimizer {
    /// The update rule.
    pub kind: OptimizerKind,
    /// Learning rate.
    pub lr: f32,
    /// L2 regularization coefficient, added to the gradient as `l2 * w`.
    pub l2: f32,
    /// Adam's first-moment decay.
    pub beta1: f32,
    /// Adam's second-moment decay.
    pub beta2: f32,
    /// Added to the denominator: 1e-8 (Adam's, and a job file's for any kind it names),
    /// 1e-10 for `Optimizer::adagrad` (PyTorch's; a job file without `[sparse_optimizer]`).
    pub epsilon: f32,
    /// Adagrad's initial accumulator value (Paddle's `initial_g2sum` in its Adagrad rules).
    pub initial_accumulator: f32,
    /// Paddle's rules keep each weight within `[min, max]` (Paddle's `weight_bounds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bounds: Option<[f32; 2]>,
}

/// An optimizer as a job file writes it: any setting may be left out.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OptimizerFields {
    kind: Option<OptimizerKind>,
    lr: Option<f32>,
    l2: Option<f32>,
    beta1: Option<f32>,
    beta2: Option<f32>,
    epsilon: Option<f32>,
    #[serde(alias = "initial_g2sum")]
    initial_accumulator: Option<f32>,
    weight_bounds: Option<[f32; 2]>,
}

impl From<OptimizerFields> for Optimizer {
    fn from(f: OptimizerFields) -> Optimizer {
        let kind = f.kind.unwrap_or(OptimizerKind::Adam);
        let base = Optimizer::defaults(kind);
        Optimizer {
            kind,
            lr: f.lr.unwrap_or(base.lr),
            l2: f.l2.unwrap_or(base.l2),
            beta1: f.beta1.unwrap_or(base.beta1),
            beta2: f.beta2.unwrap_or(base.beta2),
            epsilon: f.epsilon.unwrap_or(base.epsilon),
            initial_accumulator: f.initial_accumulator.unwrap_or(base.initial_accumulator),
            weight_bounds: f.weight_bounds.or(base.weight_bounds),
        }
    }
}

impl Default for Optimizer {
    fn default() -> Self {
        Optimizer::adam(1e-3)
    }
}

impl Optimizer {
    /// SGD with learning rate `lr` and no regularization.
    pub fn sgd(lr: f32) -> Self {
        Optimizer {
            kind: OptimizerKind::Sgd,
            lr,
            l2: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            initial_accumulator: 0.0,
            weight_bounds: None,
        }
    }

    /// One of Paddle's sparse rules with the defaults `the_one_ps.py` sets: learning rate 0.05
    /// (Adam's 0.001), `initial_g2sum` 3, weights bounded to [-10, 10].
    pub fn paddle(kind: OptimizerKind) -> Self {
        let lr = if matches!(kind, OptimizerKind::SparseAdam | OptimizerKind::SparseSharedAdam) { 0.001 } else { 0.05 };
        Optimizer { kind, initial_accumulator: 3.0, weight_bounds: Some([-10.0, 10.0]), ..Optimizer::sgd(lr) }
    }

    /// Adagrad with learning rate `lr`, PyTorch's defaults otherwise.
    pub fn adagrad(lr: f32) -> Self {
        Optimizer { kind: OptimizerKind::Adagrad, epsilon: 1e-10, ..Optimizer::sgd(lr) }
    }

    /// Adam with learning rate `lr`, PyTorch's defaults otherwise.
    pub fn adam(lr: f32) -> Self {
        Optimizer { kind: OptimizerKind::Adam, ..Optimizer::sgd(lr) }
    }

    /// The settings a job file that names only `kind` gets: Paddle's for its rules; PyTorch's
    /// keep the defaults job files always had, Adam's, with the kind set.
    pub fn defaults(kind: OptimizerKind) -> Self {
        match kind {
            _ if kind.is_paddle() => Optimizer::paddle(kind),
            OptimizerKind::AdamD2Sum => Optimizer::adam_d2sum(1e-3),
            _ => Optimizer { kind, ..Optimizer::default() },
        }
    }

    /// This optimizer with its rule changed to `kind` (a flag over a job file): the new rule's
    /// own settings (its betas, epsilon, accumulator, bounds), this one's learning rate and L2.
    /// Keeping the old rule's betas ran `adam_d2sum` with Adam's, without a word.
    pub fn with_kind(self, kind: OptimizerKind) -> Self {
        if kind == self.kind {
            return self;
        }
        Optimizer { lr: self.lr, l2: self.l2, ..Optimizer::defaults(kind) }
    }

    /// Paddle's dense `DAdamD2Sum` with learning rate `lr` and `the_one_ps.py`'s settings:
    /// `MomentDecayRate` 0.99 (`beta1`), `AdaDecayRate` 0.9999 (`beta2`), `AdaEpsilon` 1e-8.
    pub fn adam_d2sum(lr: f32) -> Self {
        Optimizer { kind: OptimizerKind::AdamD2Sum, beta1: 0.99, beta2: 0.9999, ..Optimizer::sgd(lr) }
    }

    /// GEO's server rule ([`OptimizerKind::Sum`]).
    pub fn sum() -> Self {
        Optimizer { kind: OptimizerKind::Sum, ..Optimizer::sgd(1.0) }
    }

    /// Checks a rule a job file names: any but [`OptimizerKind::Sum`], which `--mode geo` sets
    /// on the servers; then [`Optimizer::validate`].
    pub fn validate_named(&self, what: &str) -> Result<(), String> {
        if self.kind == OptimizerKind::Sum {
            return Err(format!(
                "{what} optimizer: sum is the rule GEO's servers run (--mode geo sets it); name the rule the trainers run"
            ));
        }
        self.validate(what)
    }

    /// Checks the hyper-parameters; `what` names the table in the message.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        // Every setting finite: an infinite l2 or bound passed `>= 0` and trained to NaN.
        let g2sum_needed = matches!(self.kind, OptimizerKind::SparseAdagrad | OptimizerKind::StdAdagrad);
        let bad = [
            ("lr", self.lr, self.lr > 0.0, "above 0"),
            ("l2", self.l2, self.l2 >= 0.0, "0 or more"),
            ("beta1", self.beta1, (0.0..1.0).contains(&self.beta1), "in [0, 1)"),
            ("beta2", self.beta2, (0.0..1.0).contains(&self.beta2), "in [0, 1)"),
            ("epsilon", self.epsilon, self.epsilon > 0.0, "above 0"),
            (
                "initial_accumulator",
                self.initial_accumulator,
                self.initial_accumulator > 0.0 || (!g2sum_needed && self.initial_accumulator == 0.0),
                if g2sum_needed { "above 0 for this rule" } else { "0 or more" },
            ),
        ]
        .into_iter()
        .find(|&(_, v, ok, _)| !(ok && v.is_finite()));
        if let Some((name, v, _, want)) = bad {
            return Err(format!(
                "{what} optimizer ({:?}): {name} is {v}; it must be a finite number {want}",
                self.kind
            ));
        }
        if self.weight_bounds.is_some() && !self.kind.is_paddle() {
            // Accepted and ignored, the job ran without the bounds it asked for.
            return Err(format!(
                "{what} optimizer ({:?}): weight_bounds are kept by Paddle's sparse rules only (sparse_naive, \
                 sparse_adagrad, std_adagrad, sparse_adam, sparse_shared_adam); this rule would ignore them",
                self.kind
            ));
        }
        if let Some([lo, hi]) = self.weight_bounds {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(format!(
                    "{what} optimizer ({:?}): weight_bounds [{lo}, {hi}] must be finite, low <= high",
                    self.kind
                ));
            }
        }
        Ok(())
    }

    /// Floats of optimizer state kept beside `dim` weights.
    pub fn state_len(&self, dim: usize) -> usize {
        match self.kind {
            OptimizerKind::SparseNaive
            | OptimizerKind::SparseAdagrad
            | OptimizerKind::StdAdagrad
            | OptimizerKind::SparseAdam
            | OptimizerKind::SparseSharedAdam => super::paddle_rules::state_len(self.kind, dim),
            OptimizerKind::Sgd | OptimizerKind::Sum => 0,
            OptimizerKind::Adagrad => dim,
            // m, v, then this row's step count t (rows are updated at different times). The
            // bias corrections 1 - beta^t are computed from t in f64: kept as running f32
            // products they would lose 1e-4 of relative precision to cancellation.
            OptimizerKind::Adam => 2 * dim + 1,
            // The momentum and g2sum per weight, then d2sum: Paddle keeps one per weight, but
            // every push moves every weight of a block, so they are all the same number.
            OptimizerKind::AdamD2Sum => 2 * dim + 1,
        }
    }

    /// Floats of state that the first `k` weights of a row own, when the state splits by weight
    /// (so those weights can be updated alone): SGD and Adagrad; Adam's shared step count does
    /// not split.
    pub fn prefix_state_len(&self, k: usize) -> Option<usize> {
        match self.kind {
            OptimizerKind::Sgd | OptimizerKind::SparseNaive | OptimizerKind::Sum => Some(0),
            OptimizerKind::Adagrad | OptimizerKind::StdAdagrad => Some(k),
            _ => None,
        }
    }

    /// Writes the initial optimizer state.
    pub fn init_state(&self, state: &mut [f32]) {
        match self.kind {
            OptimizerKind::SparseNaive
            | OptimizerKind::SparseAdagrad
            | OptimizerKind::StdAdagrad
            | OptimizerKind::SparseAdam
            | OptimizerKind::SparseSharedAdam => super::paddle_rules::init_state(self, state),
            OptimizerKind::Sgd | OptimizerKind::Sum => {}
            OptimizerKind::Adagrad => state.fill(self.initial_accumulator),
            OptimizerKind::Adam | OptimizerKind::AdamD2Sum => {
                state.fill(0.0);
            }
        }
    }

    /// Applies one push to a sparse row: the gradient sum `grad` over a batch (scaled by
    /// `scale`, 1 / samples) in which the row's id occurred `show` times (Paddle's rules use
    /// the show count instead of the batch).
    #[inline]
    pub fn update_sparse(&self, w: &mut [f32], state: &mut [f32], grad: &[f32], scale: f32, show: f32) {
        if self.kind.is_paddle() {
            super::paddle_rules::update(self, w, state, grad, show);
        } else {
            self.update(w, state, grad, scale);
        }
    }

    /// Applies one update to `w` given the gradient sum `grad`, scaled by `scale`.
    pub fn update(&self, w: &mut [f32], state: &mut [f32], grad: &[f32], scale: f32) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { self.update_avx2(w, state, grad, scale) };
        }
        self.apply(w, state, grad, scale)
    }

    /// [`Self::update`] compiled for AVX2's 8-lane registers where the build's baseline has 4
    /// (SSE2): the dense Adam of a 2 x 2 CTR-DNN job took 5.5% of its CPU in 4 lanes. No FMA is
    /// enabled and every operation of the rules is rounded per lane (`sqrt` and `/` included),
    /// so the results are bit for bit those of the 4-lane code (a unit test holds it), and
    /// machines with and without AVX2 train the same model.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn update_avx2(&self, w: &mut [f32], state: &mut [f32], grad: &[f32], scale: f32) {
        self.apply(w, state, grad, scale)
    }

    /// The update rules, inlined into each of [`Self::update`]'s builds.
    #[inline(always)]
    fn apply(&self, w: &mut [f32], state: &mut [f32], grad: &[f32], scale: f32) {
        debug_assert_eq!(w.len(), grad.len());
        debug_assert_eq!(state.len(), self.state_len(w.len()));
        let (lr, l2) = (self.lr, self.l2);
        match self.kind {
            OptimizerKind::Sgd => {
                for (w, &g) in w.iter_mut().zip(grad) {
                    let g = g * scale + l2 * *w;
                    *w -= lr * g;
                }
            }
            // A change, not a gradient: no step size, no mean over the batch, no L2.
            OptimizerKind::Sum => w.iter_mut().zip(grad).for_each(|(w, &d)| *w += d),
            OptimizerKind::Adagrad => {
                for ((w, s), &g) in w.iter_mut().zip(state.iter_mut()).zip(grad) {
                    let g = g * scale + l2 * *w;
                    *s += g * g;
                    *w -= lr * g / (s.sqrt() + self.epsilon);
                }
            }
            OptimizerKind::Adam => {
                let dim = w.len();
                let (mv, t) = state.split_at_mut(2 * dim);
                t[0] += 1.0;
                let t = t[0] as i32;
                // torch's step, lr / (1 - b1^t) x m / (sqrt(v) / sqrt(1 - b2^t) + eps), with
                // numerator and denominator multiplied by sqrt(1 - b2^t): one division a
                // weight instead of two. The divider bounds this loop: 2.1-2.4x faster on a
                // block in cache; the result moves in the last bits only (the golden test
                // holds 1e-6). The scaled eps is kept above 0: the smallest epsilon times
                // sqrt(1 - b2^t) rounds to 0 in f32, and 0 / 0 would write NaN.
                let bias2_sqrt = (1.0 - (self.beta2 as f64).powi(t)).sqrt();
                let step_size = (lr as f64 * bias2_sqrt / (1.0 - (self.beta1 as f64).powi(t))) as f32;
                let eps = ((self.epsilon as f64 * bias2_sqrt) as f32).max(f32::from_bits(1));
                let (m, v) = mv.split_at_mut(dim);
                let (b1, b2) = (self.beta1, self.beta2);
                for (((w, m), v), &g) in w.iter_mut().zip(m).zip(v).zip(grad) {
                    let g = flush_below(g * scale + l2 * *w, SQRT_MIN_POSITIVE);
                    *m = flush_below(b1 * *m + (1.0 - b1) * g, f32::MIN_POSITIVE);
                    *v = flush_below(b2 * *v + (1.0 - b2) * g * g, f32::MIN_POSITIVE);
                    *w -= step_size * *m / (v.sqrt() + eps);
                }
            }
            OptimizerKind::AdamD2Sum => {
                let dim = w.len();
                let (mg, d2sum) = state.split_at_mut(2 * dim);
                let (mom, g2sum) = mg.split_at_mut(dim);
                let (mom_decay, ada_decay) = (self.beta1, self.beta2);
                d2sum[0] = d2sum[0] * ada_decay + 1.0;
                // The ratio in f64: with a tiny epsilon and a weight whose gradients were all
                // zero, f32's (d + eps) / eps overflowed, and infinity times a zero momentum
                // wrote NaN into the model.
                let d = d2sum[0] as f64;
                let eps = d * self.epsilon as f64;
                for (((w, mom), g2sum), &g) in w.iter_mut().zip(mom).zip(g2sum).zip(grad) {
                    let g = flush_below(g * scale + l2 * *w, SQRT_MIN_POSITIVE);
                    *g2sum = flush_below(*g2sum * ada_decay + g * g, f32::MIN_POSITIVE);
                    *mom = flush_below((*mom - g) * mom_decay + g, f32::MIN_POSITIVE);
                    let ratio = ((d + eps) / (*g2sum as f64 + eps)).sqrt();
                    *w -= (lr as f64 * *mom as f64 * ratio) as f32;
                }
            }
            // Dense parameters never run them (refused by `TableSpec::validate`); a sparse row
            // goes through `update_sparse`.
            _ => super::paddle_rules::update(self, w, state, grad, 1.0 / scale.max(f32::MIN_POSITIVE)),
        }
    }
}

/// The square root of the least normal f32: a gradient below it would square to a subnormal.
const SQRT_MIN_POSITIVE: f32 = 1.084_202_2e-19;

/// `x`, or 0 where `|x| < least`. The moments of the decaying rules (Adam's, D2Sum's) reach
/// subnormal values: a weight whose gradient is 0 (a dead ReLU unit's) sees its first moment
/// decay below the least normal f32 within about 800 steps, and a tiny gradient squares to one.
/// x86 CPUs take a microcode assist for every operation on a subnormal, which made the servers'
/// dense Adam a fifth of a 2 x 2 job's CPU (docs/src/measurements/2026-12-01-paddle.md).
/// TensorFlow runs its CPU threads with flush-to-zero for the same reason; the processor's mode
/// cannot be set safely from Rust, so the state is flushed here. What is lost is far below the
/// default eps of every rule (Adam's step for such a weight is lr x m / eps < 1e-30).
#[inline(always)]
fn flush_below(x: f32, least: f32) -> f32 {
    if x.abs() < least {
        0.0
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs three steps on w = [0.5, -1.0, 2.0] with gradients g_t = [0.1 t, -0.2, 0.3 - 0.05 t]
    /// given as sums over 2 samples (scale 0.5), and compares with `tests/golden/optim.py`, which
    /// applies torch.optim's documented update rules in float64.
    fn run(opt: Optimizer) -> Vec<f32> {
        let mut w = vec![0.5f32, -1.0, 2.0];
        let mut s = vec![0.0f32; opt.state_len(3)];
        opt.init_state(&mut s);
        for t in 1..=3 {
            let t = t as f32;
            let g = [2.0 * 0.1 * t, 2.0 * -0.2, 2.0 * (0.3 - 0.05 * t)];
            opt.update(&mut w, &mut s, &g, 0.5);
        }
        w
    }

    /// The AVX2 build of the rules writes the very bits of the baseline build, for every rule
    /// `update` runs, on lengths around the lanes (1-17, 63-65, 1000), over 40 steps of gradients
    /// that mix zeros, tiny values around the flush thresholds, and large ones.
    #[test]
    fn the_avx2_build_writes_the_bits_of_the_baseline() {
        let kinds = [
            Optimizer { l2: 0.01, ..Optimizer::sgd(0.1) },
            Optimizer { kind: OptimizerKind::Sum, ..Optimizer::sgd(0.1) },
            Optimizer { l2: 0.01, ..Optimizer::adagrad(0.1) },
            Optimizer { l2: 0.01, ..Optimizer::adam(0.1) },
            Optimizer { epsilon: 1e-45, ..Optimizer::adam(1e-3) },
            Optimizer { l2: 0.01, ..Optimizer::adam_d2sum(0.1) },
            Optimizer::paddle(OptimizerKind::SparseAdam),
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mantissa = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match x % 6 {
                0 => 0.0,
                1 => mantissa * 1e-19,
                2 => mantissa * 1e-37,
                3 => mantissa * 1e3,
                _ => mantissa,
            }
        };
        for opt in kinds {
            for dim in (1..=17).chain([63, 64, 65, 1000]) {
                let mut w: Vec<f32> = (0..dim).map(|_| draw()).collect();
                let mut s = vec![0.0f32; opt.state_len(dim)];
                opt.init_state(&mut s);
                let (mut w2, mut s2) = (w.clone(), s.clone());
                for _ in 0..40 {
                    let g: Vec<f32> = (0..dim).map(|_| draw()).collect();
                    opt.update(&mut w, &mut s, &g, 0.5);
                    opt.apply(&mut w2, &mut s2, &g, 0.5);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&w), bits(&w2), "{:?} dim {dim}", opt.kind);
                    assert_eq!(bits(&s), bits(&s2), "{:?} dim {dim}", opt.kind);
                }
            }
        }
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!(((*g as f64) - w).abs() <= 1e-6 * w.abs().max(1.0), "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn sgd_with_l2_matches_golden() {
        let opt = Optimizer { l2: 0.01, ..Optimizer::sgd(0.1) };
        assert_close(&run(opt), &[0.4385414895, -0.937062979, 1.9340759730000001]);
    }

    #[test]
    fn adagrad_with_l2_matches_golden() {
        let opt = Optimizer { l2: 0.01, ..Optimizer::adagrad(0.1) };
        assert_close(&run(opt), &[0.23135275184598625, -0.7719454672190714, 1.793417762233879]);
    }

    #[test]
    fn adam_with_l2_matches_golden() {
        let opt = Optimizer { l2: 0.01, ..Optimizer::adam(0.1) };
        assert_close(&run(opt), &[0.20707367323594328, -0.7000467282918086, 1.704429343197273]);
    }

    #[test]
    fn adam_keeps_a_weight_with_no_gradient_under_the_smallest_epsilon() {
        let opt = Optimizer { epsilon: 1e-45, ..Optimizer::adam(0.1) };
        let (mut w, mut s) = (vec![0.5f32, 2.0], vec![0.0; opt.state_len(2)]);
        for _ in 0..3 {
            opt.update(&mut w, &mut s, &[0.0, 0.3], 1.0);
        }
        assert_eq!(w[0], 0.5, "0 / (0 + eps) is 0, not NaN");
        assert!(w[1].is_finite() && w[1] < 2.0, "{w:?}");
    }

    #[test]
    fn paddles_dense_adam_d2sum_matches_golden() {
        let opt = Optimizer { l2: 0.01, ..Optimizer::adam_d2sum(0.1) };
        assert_close(&run(opt), &[0.49433478423509386, -0.9940399022909662, 1.9941054850256086]);
        let opt = Optimizer { beta1: 0.9, beta2: 0.99, ..Optimizer::adam_d2sum(0.1) };
        assert_close(&run(opt), &[0.44579141600294625, -0.9439000067319988, 1.9450871761883002]);
        // A weight whose gradients are all zero stays put under the smallest epsilon (it was NaN).
        let opt = Optimizer { epsilon: 1e-45, ..Optimizer::adam_d2sum(0.1) };
        let (mut w, mut s) = (vec![0.5f32, 2.0], vec![0.0; opt.state_len(2)]);
        opt.update(&mut w, &mut s, &[0.0, 0.3], 1.0);
        assert_eq!(w[0], 0.5);
        assert!(w[1].is_finite() && w[1] < 2.0, "{w:?}");
        // Bounds only a Paddle rule keeps are refused on another, not ignored.
        let bounded = Optimizer { weight_bounds: Some([-1.0, 1.0]), ..Optimizer::adam_d2sum(0.1) };
        assert!(bounded
            .validate("dense")
            .unwrap_err()
            .contains("weight_bounds are kept by Paddle's sparse rules only"));
        // A flag that changes a job file's rule gives the new rule's settings, not the old one's.
        let switched = Optimizer { lr: 0.01, ..Optimizer::adam(0.01) }.with_kind(OptimizerKind::AdamD2Sum);
        assert_eq!(switched, Optimizer::adam_d2sum(0.01));
        assert_eq!(switched.with_kind(OptimizerKind::Adam), Optimizer::adam(0.01));
        let sparse = Optimizer::adagrad(0.05).with_kind(OptimizerKind::SparseAdagrad);
        assert_eq!(sparse, Optimizer::paddle(OptimizerKind::SparseAdagrad));
        // A job file names it as Paddle's strategy or its class does, and gets Paddle's settings.
        for text in ["kind = \"adam_d2sum\"", "kind = \"DAdamD2Sum\""] {
            assert_eq!(toml::from_str::<Optimizer>(text).unwrap(), Optimizer::adam_d2sum(1e-3), "{text}");
        }
    }

    #[test]
    fn job_files_name_paddles_rules_and_get_their_defaults() {
        let o: Optimizer = toml::from_str(r#"kind = "SparseAdaGradSGDRule""#).unwrap();
        assert_eq!(o, Optimizer::paddle(OptimizerKind::SparseAdagrad));
        let o: Optimizer =
            toml::from_str("kind = \"std_adagrad\"\ninitial_g2sum = 1.5\nweight_bounds = [-1.0, 1.0]").unwrap();
        assert_eq!(
            (o.kind, o.initial_accumulator, o.weight_bounds),
            (OptimizerKind::StdAdagrad, 1.5, Some([-1.0, 1.0]))
        );
        // PyTorch's rules keep the defaults job files always had.
        let o: Optimizer = toml::from_str("kind = \"adagrad\"\nlr = 0.05").unwrap();
        assert_eq!(o, Optimizer { kind: OptimizerKind::Adagrad, lr: 0.05, ..Optimizer::default() });
        assert!(toml::from_str::<Optimizer>("kind = \"adagrad\"\nlearning_rate = 1").is_err());
        let bad = Optimizer { weight_bounds: Some([1.0, -1.0]), ..Optimizer::paddle(OptimizerKind::SparseNaive) };
        assert!(bad.validate("t").is_err());
    }

    #[test]
    fn adagrad_initial_accumulator_is_used() {
        let opt = Optimizer { initial_accumulator: 3.0, ..Optimizer::adagrad(0.1) };
        let mut s = vec![0.0; 1];
        opt.init_state(&mut s);
        assert_eq!(s, [3.0]);
    }

    #[test]
    fn decayed_moments_become_zero_instead_of_subnormal() {
        // Steps after which the unflushed moments of the dead weight are subnormal (Adam's first
        // moment from about 800 steps, D2Sum's momentum from about 7,400), not yet zero.
        for (opt, steps) in [(Optimizer::adam(1e-3), 900), (Optimizer::adam_d2sum(1e-3), 8_000)] {
            let mut w = vec![0.5f32, -1.0];
            let mut s = vec![0.0f32; opt.state_len(2)];
            opt.init_state(&mut s);
            // One real gradient, then a dead unit's zeros (and a gradient too small to square).
            opt.update(&mut w, &mut s, &[1e-3, 1e-3], 1.0);
            for _ in 0..steps {
                opt.update(&mut w, &mut s, &[0.0, 1e-20], 1.0);
            }
            assert!(s.iter().all(|x| x.is_normal() || *x == 0.0), "{:?}: {s:?}", opt.kind);
            assert!(w.iter().all(|x| x.is_finite()));
        }
    }
}
