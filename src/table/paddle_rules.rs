//! PaddlePaddle's sparse update rules (`sparse_sgd_rule.cc`), so a table migrated from a Fleet
//! job runs the very optimizer it ran there: `SparseNaiveSGDRule`, `SparseAdaGradSGDRule` (one
//! accumulator per row), `StdAdaGradSGDRule` (one per weight), `SparseAdamSGDRule` and
//! `SparseSharedAdamSGDRule` (one moment pair per row), each keeping the weights within its
//! bounds. As in Paddle, the Adagrad rules divide the pushed gradient sum by the row's show
//! count in the push (the mean gradient per occurrence); the naive and Adam rules take the sum
//! as it is. Pure functions on one row; `tests/golden/paddle_sparse_rules.py` computes the
//! golden numbers of the tests from the same formulas.

use super::optim::{Optimizer, OptimizerKind};

/// Floats of state a rule keeps beside `dim` weights.
pub fn state_len(kind: OptimizerKind, dim: usize) -> usize {
    match kind {
        OptimizerKind::SparseNaive => 0,
        OptimizerKind::SparseAdagrad => 1,
        OptimizerKind::StdAdagrad => dim,
        // First and second moments per weight, then beta1^t and beta2^t.
        OptimizerKind::SparseAdam => 2 * dim + 2,
        OptimizerKind::SparseSharedAdam => 4,
        OptimizerKind::Sgd
        | OptimizerKind::Adagrad
        | OptimizerKind::Adam
        | OptimizerKind::AdamD2Sum
        | OptimizerKind::Sum => {
            unreachable!("not a Paddle sparse rule")
        }
    }
}

/// Writes a new row's state: accumulators at zero, the Adam rules' powers at beta1 and beta2.
pub fn init_state(o: &Optimizer, state: &mut [f32]) {
    state.fill(0.0);
    if matches!(o.kind, OptimizerKind::SparseAdam | OptimizerKind::SparseSharedAdam) {
        let n = state.len();
        state[n - 2] = o.beta1;
        state[n - 1] = o.beta2;
    }
}

/// Applies one push to a row: `grad` is the gradient sum over the push's `show` occurrences.
pub fn update(o: &Optimizer, w: &mut [f32], state: &mut [f32], grad: &[f32], show: f32) {
    let (lo, hi) = o.weight_bounds.map_or((f32::MIN, f32::MAX), |[lo, hi]| (lo, hi));
    let bound = |x: f32| x.clamp(lo, hi);
    let dim = w.len();
    // Paddle divides by the show count; a push without shows counts as one.
    let scale = show.max(1.0) as f64;
    let (lr, init) = (o.lr, o.initial_accumulator);
    match o.kind {
        OptimizerKind::SparseNaive => {
            for (w, g) in w.iter_mut().zip(grad) {
                *w = bound(*w - lr * g);
            }
        }
        OptimizerKind::SparseAdagrad => {
            let g2sum = state[0];
            let mut add = 0.0f64;
            for (w, &g) in w.iter_mut().zip(grad) {
                let g = g as f64 / scale;
                *w = bound((*w as f64 - lr as f64 * g * (init as f64 / (init as f64 + g2sum as f64)).sqrt()) as f32);
                add += g * g;
            }
            state[0] = (g2sum as f64 + add / dim as f64) as f32;
        }
        OptimizerKind::StdAdagrad => {
            for ((w, s), &g) in w.iter_mut().zip(state.iter_mut()).zip(grad) {
                let g = g as f64 / scale;
                *w = bound((*w as f64 - lr as f64 * g * (init as f64 / (init as f64 + *s as f64)).sqrt()) as f32);
                *s = (*s as f64 + g * g) as f32;
            }
        }
        OptimizerKind::SparseAdam => {
            let (moments, pows) = state.split_at_mut(2 * dim);
            let (m, v) = moments.split_at_mut(dim);
            let step = lr * (1.0 - pows[1]).sqrt() / (1.0 - pows[0]);
            let (b1, b2) = (o.beta1, o.beta2);
            for i in 0..dim {
                let g = grad[i];
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                w[i] = bound(w[i] - step * (m[i] / (v[i].sqrt() + o.epsilon)));
            }
            pows[0] *= b1;
            pows[1] *= b2;
        }
        OptimizerKind::SparseSharedAdam => {
            let (m, v) = (state[0], state[1]);
            let step = lr * (1.0 - state[3]).sqrt() / (1.0 - state[2]);
            let (b1, b2) = (o.beta1 as f64, o.beta2 as f64);
            let (mut sum_m, mut sum_v) = (0.0f64, 0.0f64);
            for (w, &g) in w.iter_mut().zip(grad) {
                let g = g as f64;
                let new_m = b1 * m as f64 + (1.0 - b1) * g;
                let new_v = b2 * v as f64 + (1.0 - b2) * g * g;
                *w = bound((*w as f64 - step as f64 * (new_m / (new_v.sqrt() + o.epsilon as f64))) as f32);
                sum_m += new_m;
                sum_v += new_v;
            }
            state[0] = (sum_m / dim as f64) as f32;
            state[1] = (sum_v / dim as f64) as f32;
            state[2] *= o.beta1;
            state[3] *= o.beta2;
        }
        OptimizerKind::Sgd
        | OptimizerKind::Adagrad
        | OptimizerKind::Adam
        | OptimizerKind::AdamD2Sum
        | OptimizerKind::Sum => {
            unreachable!("not a Paddle sparse rule")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three pushes on w = [0.5, -1.0, 2.0]: gradient sums show_t * [0.1 t, -0.2, 0.3 - 0.05 t]
    /// with shows 2, 1, 3, as `tests/golden/paddle_sparse_rules.py` runs them in float64.
    fn run(o: Optimizer) -> Vec<f32> {
        let mut w = vec![0.5f32, -1.0, 2.0];
        let mut s = vec![0.0f32; o.state_len(3)];
        o.init_state(&mut s);
        for (t, show) in [(1.0f32, 2.0f32), (2.0, 1.0), (3.0, 3.0)] {
            let g = [show * 0.1 * t, show * -0.2, show * (0.3 - 0.05 * t)];
            o.update_sparse(&mut w, &mut s, &g, 0.5, show);
        }
        w
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!(((*g as f64) - w).abs() <= 2e-6 * w.abs().max(1.0), "got {got:?}, want {want:?}");
        }
    }

    fn rule(name: &str) -> Optimizer {
        Optimizer::paddle(serde_json::from_value(serde_json::json!(name)).unwrap())
    }

    #[test]
    fn naive_sgd_matches_paddle() {
        assert_close(&run(rule("sparse_naive")), &[0.43499999999999994, -0.94, 1.9425000000000001]);
    }

    #[test]
    fn row_wise_adagrad_matches_paddle() {
        assert_close(
            &run(rule("SparseAdaGradSGDRule")),
            &[0.47025199522178307, -0.9701886368478557, 1.970156957660892],
        );
    }

    #[test]
    fn per_weight_adagrad_matches_paddle() {
        assert_close(&run(rule("StdAdaGradSGDRule")), &[0.47014008400499024, -0.9701967318976157, 1.9702274993795181]);
    }

    #[test]
    fn adam_matches_paddle() {
        assert_close(&run(rule("SparseAdamSGDRule")), &[0.4971589370994497, -0.9971250890343926, 1.9971587784987346]);
    }

    #[test]
    fn shared_adam_matches_paddle() {
        assert_close(
            &run(rule("SparseSharedAdamSGDRule")),
            &[0.4978396102058321, -0.998416644729669, 1.9979018486884736],
        );
    }

    #[test]
    fn weights_stay_within_their_bounds() {
        let o = Optimizer { lr: 100.0, ..rule("sparse_naive") };
        assert_eq!(run(o), [-10.0, 10.0, -10.0]);
        let o = Optimizer { weight_bounds: None, lr: 100.0, ..rule("sparse_naive") };
        assert!((run(o)[1] - 119.0).abs() < 1e-3, "-1 + 100 * (0.4 + 0.2 + 0.6)");
    }

    #[test]
    fn paddles_defaults_are_the_ones_fleet_sets() {
        let a = rule("sparse_adagrad");
        assert_eq!((a.lr, a.initial_accumulator, a.weight_bounds), (0.05, 3.0, Some([-10.0, 10.0])));
        let m = rule("sparse_adam");
        assert_eq!((m.lr, m.beta1, m.beta2, m.epsilon), (0.001, 0.9, 0.999, 1e-8));
        assert_eq!((a.state_len(10), rule("std_adagrad").state_len(10), m.state_len(10)), (1, 10, 22));
    }
}
