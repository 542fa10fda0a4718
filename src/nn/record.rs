//! What the matrix products of a piece of code are and cost, counted inside
//! [`matmul`](super::matmul):
//! - their shapes: `oar bench --roofline --model` records a zoo model's training pass with
//!   [`record_products`], then times each shape with oar's kernel and a reference BLAS;
//! - their seconds and FLOPs ([`count_products`], [`totals`]): `oar bench --roofline` splits a
//!   training step's compute into matrix math and the rest from counts, not estimates.
//!
//! Both are process-wide (a trainer's replicas run on threads of their own) and off unless
//! asked for: `matmul` then pays two relaxed loads a call, where clock reads and shared adds
//! would cost 4% of a 39 x 8 x 39 attention head's product.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

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

/// Guards counting on; counting stops when the last one is dropped.
static COUNTING: AtomicUsize = AtomicUsize::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);
static FLOPS: AtomicU64 = AtomicU64::new(0);

/// While the guard lives (guards nest), every product's seconds and FLOPs are added to
/// [`totals`], on every thread of the process.
#[must_use = "counting stops when the guard is dropped"]
pub fn count_products() -> Counting {
    COUNTING.fetch_add(1, Relaxed);
    Counting(())
}

/// Counting on while it lives (see [`count_products`]).
pub struct Counting(());

impl Drop for Counting {
    fn drop(&mut self) {
        COUNTING.fetch_sub(1, Relaxed);
    }
}

/// Seconds spent in [`matmul`](super::matmul) by all the process's threads while counting was
/// on, and the floating-point operations done (2 m n k a call).
pub fn totals() -> (f64, u64) {
    (NANOS.load(Relaxed) as f64 * 1e-9, FLOPS.load(Relaxed))
}

/// When a product starts: the clock, if counting is on.
#[inline]
pub(super) fn start() -> Option<Instant> {
    (COUNTING.load(Relaxed) > 0).then(Instant::now)
}

/// Adds a product of `m x k` times `k x n` begun at `started` (see [`start`]) to the totals.
#[inline]
pub(super) fn done(started: Option<Instant>, m: usize, n: usize, k: usize) {
    if let Some(started) = started {
        NANOS.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        FLOPS.fetch_add(2 * (m * n * k) as u64, Relaxed);
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

    #[test]
    fn products_are_counted_only_while_a_guard_lives() {
        let (a, b, mut c) = (vec![1.0f32; 6], vec![1.0f32; 6], vec![0.0f32; 4]);
        let product = |c: &mut [f32]| crate::nn::matmul(2, 2, 3, c, false, &a, (3, 1), &b, (2, 1));
        let counting = count_products();
        assert!(start().is_some());
        let before = totals().1;
        product(&mut c);
        // Other tests' products may count too while this guard lives, never fewer.
        assert!(totals().1 >= before + 24);
        drop(counting);
        assert_eq!(c, [3.0; 4]);
    }
}
