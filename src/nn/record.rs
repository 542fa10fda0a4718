//! The shapes of the matrix products a piece of code computes: `oar bench --roofline --model`
//! records a zoo model's training pass with [`record_products`], then times each shape with
//! oar's kernel and a reference BLAS. Recording is process-wide (a trainer's replicas run on
//! threads of their own) and off unless a recording runs: [`matmul`](super::matmul) then pays
//! one relaxed load a call.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

/// One product as [`matmul`](super::matmul) saw it: `m x k` times `k x n`, with each operand
/// stored transposed or not (a column stride other than 1 is a transposed operand).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProductShape {
    /// Rows of the product.
    pub m: usize,
    /// Columns of the product.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// The left operand is stored `k x m`.
    pub a_transposed: bool,
    /// The right operand is stored `n x k`.
    pub b_transposed: bool,
}

impl ProductShape {
    /// Floating-point operations of one call: 2 m n k.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }
}

static RECORDING: AtomicBool = AtomicBool::new(false);
/// The shapes seen while recording, each with its calls, in first-seen order (a model has a few
/// dozen shapes at most, so a list searched in order is enough).
static RECORDED: Mutex<Vec<(ProductShape, u64)>> = Mutex::new(Vec::new());
/// One recording at a time: a second waits for the first to end.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `f` and returns what it returned with the shapes of every matrix product computed while
/// it ran, on any thread of the process, each with its number of calls, in first-seen order.
pub fn record_products<R>(f: impl FnOnce() -> R) -> (R, Vec<(ProductShape, u64)>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            RECORDING.store(false, Relaxed);
        }
    }
    recorded().clear();
    RECORDING.store(true, Relaxed);
    let stop = Stop;
    let r = f();
    drop(stop);
    (r, std::mem::take(&mut *recorded()))
}

fn recorded() -> std::sync::MutexGuard<'static, Vec<(ProductShape, u64)>> {
    RECORDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts one product of `m x k` (`a`'s strides) times `k x n` (`b`'s) while a recording runs.
#[inline]
pub(super) fn note(m: usize, n: usize, k: usize, a_strides: (usize, usize), b_strides: (usize, usize)) {
    if !RECORDING.load(Relaxed) {
        return;
    }
    let shape = ProductShape { m, n, k, a_transposed: a_strides.1 != 1, b_transposed: b_strides.1 != 1 };
    let mut seen = recorded();
    match seen.iter_mut().find(|(s, _)| *s == shape) {
        Some((_, calls)) => *calls += 1,
        None => seen.push((shape, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_are_recorded_with_their_layouts_and_calls_only_while_recording() {
        // A shape no other test multiplies: tests run in parallel, and a recording sees every
        // thread's products.
        let (m, n, k) = (3, 7, 11);
        let (a, b, mut c) = (vec![1.0f32; m * k], vec![1.0f32; k * n], vec![0.0f32; m * n]);
        let product = |c: &mut [f32], transposed: bool| {
            let a_strides = if transposed { (1, m) } else { (k, 1) };
            crate::nn::matmul(m, n, k, c, false, &a, a_strides, &b, (n, 1));
        };
        let plain = ProductShape { m, n, k, a_transposed: false, b_transposed: false };
        let ours = |seen: &[(ProductShape, u64)]| -> Vec<(ProductShape, u64)> {
            seen.iter().copied().filter(|(s, _)| (s.m, s.n, s.k) == (m, n, k)).collect()
        };
        product(&mut c, false);
        let ((), seen) = record_products(|| {
            product(&mut c, false);
            std::thread::scope(|s| {
                s.spawn(|| product(&mut vec![0.0; m * n], true));
            });
            product(&mut c, false);
        });
        assert_eq!(ours(&seen), [(plain, 2), (ProductShape { a_transposed: true, ..plain }, 1)]);
        assert_eq!(plain.flops(), 2.0 * 3.0 * 7.0 * 11.0);
        product(&mut c, false);
        let ((), later) = record_products(|| ());
        assert!(ours(&later).is_empty(), "products outside a recording are not counted: {later:?}");
    }
}
