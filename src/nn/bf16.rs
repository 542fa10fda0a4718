//! Matrix products with bf16 operands and f32 accumulation, on CPUs with AVX512_BF16.
//!
//! Both operands are rounded to bf16 (round to nearest, ties to even: the f32's top 16 bits)
//! while they are packed, and `vdpbf16ps` adds each pair of products into f32 accumulators: a
//! product of two bf16 values is exact in f32, so the only roundings are the operands' and the
//! f32 sums'. The weights stay f32 (the servers' and the optimizer's copy); only the products
//! see bf16.
//!
//! Why by hand: no crate on crates.io multiplies bf16 matrices on the CPU's `vdpbf16ps` (`gemm`
//! does f32, f64 and f16; `half` converts but does not multiply), and the kernel is one
//! register tile: `MR` rows by 32 columns, the left operand broadcast a pair at a time, the
//! right one packed in panels of 32 columns by pairs of its rows. Single-threaded, as
//! [`super::matmul`] is.
//!
//! A product's value depends only on its operands and shapes (the same packing, the same
//! order of sums in the inner dimension), so sync training stays bit-equal to local training
//! at this precision.

use std::arch::x86_64::*;

use super::Operands;

/// Rows of the register tile: 8 rows x 2 vectors of 16 columns = 16 accumulators.
const MR: usize = 8;
/// Columns of the register tile and of a packed panel of the right operand.
const NR: usize = 32;

/// Whether this CPU multiplies bf16 pairs (`avx512f` and `avx512bf16`; std caches the check).
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// `x` rounded to bf16 (nearest, ties to even), as its 16 bits; NaN stays a quiet NaN.
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    if nan {
        ((b >> 16) | 0x40) as u16
    } else {
        rounded
    }
}

/// Two bf16 values in one 32-bit lane as `vdpbf16ps` reads them: `even` in the low half.
#[inline(always)]
fn pair(even: f32, odd: f32) -> u32 {
    to_bf16(even) as u32 | (to_bf16(odd) as u32) << 16
}

/// `out[i] = pair(even[i], odd[i])`: two rows of an operand side by side (vectorizes).
#[inline(always)]
fn zip_pairs(even: &[f32], odd: Option<&[f32]>, out: &mut [u32]) {
    match odd {
        Some(odd) => out.iter_mut().zip(even.iter().zip(odd)).for_each(|(o, (&e, &d))| *o = pair(e, d)),
        None => out.iter_mut().zip(even).for_each(|(o, &e)| *o = pair(e, 0.0)),
    }
}

/// `out[p] = pair(run[2p], run[2p + 1])`: a run of the inner dimension, contiguous in memory.
#[inline(always)]
fn run_pairs(run: &[f32], out: &mut [u32]) {
    let mut chunks = run.chunks_exact(2);
    out.iter_mut().zip(&mut chunks).for_each(|(o, c)| *o = pair(c[0], c[1]));
    if let [last] = chunks.remainder() {
        out[run.len() / 2] = pair(*last, 0.0);
    }
}

/// The left operand `a` (m x k, given strides) packed as pairs of its inner dimension, with
/// the strides (per row, per pair) in lanes at which the kernel finds them. Rows are padded
/// with zeros to a multiple of `MR`.
#[target_feature(enable = "avx512f")]
fn pack_a(m: usize, k: usize, a: &[f32], (rs, cs): (usize, usize), out: &mut Vec<u32>) -> (usize, usize) {
    let (kp, mp) = (k.div_ceil(2), m.div_ceil(MR) * MR);
    out.clear();
    out.resize(mp * kp, 0);
    if cs == 1 {
        // Rows contiguous in the inner dimension: each row is a run of pairs.
        for r in 0..m {
            run_pairs(&a[r * rs..r * rs + k], &mut out[r * kp..(r + 1) * kp]);
        }
        (kp, 1)
    } else if rs == 1 {
        // A transposed view: each pair of inner indices is two contiguous runs over the rows.
        for p in 0..kp {
            let even = &a[2 * p * cs..2 * p * cs + m];
            let odd = (2 * p + 1 < k).then(|| &a[(2 * p + 1) * cs..(2 * p + 1) * cs + m]);
            zip_pairs(even, odd, &mut out[p * mp..p * mp + m]);
        }
        (1, mp)
    } else {
        for r in 0..m {
            for p in 0..kp {
                let odd = if 2 * p + 1 < k { a[r * rs + (2 * p + 1) * cs] } else { 0.0 };
                out[r * kp + p] = pair(a[r * rs + 2 * p * cs], odd);
            }
        }
        (kp, 1)
    }
}

/// The right operand `b` (k x n, given strides) packed in panels of `NR` columns, each panel
/// `kp` pairs of rows by `NR` lanes; columns beyond `n` are zeros.
#[target_feature(enable = "avx512f")]
fn pack_b(k: usize, n: usize, b: &[f32], (rs, cs): (usize, usize), out: &mut Vec<u32>, column: &mut Vec<u32>) {
    let (kp, panels) = (k.div_ceil(2), n.div_ceil(NR));
    out.clear();
    out.resize(panels * kp * NR, 0);
    if cs == 1 {
        // Rows contiguous: a panel's pair row is two rows' runs of up to NR columns.
        for p in 0..kp {
            for j in (0..n).step_by(NR) {
                let w = NR.min(n - j);
                let even = &b[2 * p * rs + j..2 * p * rs + j + w];
                let odd = (2 * p + 1 < k).then(|| &b[(2 * p + 1) * rs + j..(2 * p + 1) * rs + j + w]);
                let at = (j / NR * kp + p) * NR;
                zip_pairs(even, odd, &mut out[at..at + w]);
            }
        }
    } else if rs == 1 {
        // Columns contiguous (a transposed view): each column is a run of pairs, spread over
        // its panel's lanes.
        column.resize(kp, 0);
        for j in 0..n {
            run_pairs(&b[j * cs..j * cs + k], column);
            let base = j / NR * kp * NR + j % NR;
            for (p, &v) in column.iter().enumerate() {
                out[base + p * NR] = v;
            }
        }
    } else {
        for j in 0..n {
            for p in 0..kp {
                let odd = if 2 * p + 1 < k { b[(2 * p + 1) * rs + j * cs] } else { 0.0 };
                out[j / NR * kp * NR + p * NR + j % NR] = pair(b[2 * p * rs + j * cs], odd);
            }
        }
    }
}

/// One register tile: `rows` (at most `MR`) rows of `dst` from `a` (broadcast a pair at a
/// time, at `a_strides` lanes per row and per pair) times one packed panel `b`; `mask` picks
/// the panel's live columns in each half.
///
/// # Safety
/// The CPU has avx512f and avx512bf16; `a` holds `MR` rows of `kp` pairs at its strides, `b`
/// holds `kp * NR` lanes, and `dst` is valid for `rows` rows of `ldc` floats from the tile's
/// corner where the mask selects.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kp: usize,
    a: *const u32,
    (ars, aps): (usize, usize),
    b: *const u32,
    dst: *mut f32,
    ldc: usize,
    rows: usize,
    mask: [u16; 2],
    accumulate: bool,
) {
    // SAFETY (whole body): the caller's contract above bounds every pointer offset.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..kp {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_epi32(b.add(p * NR) as *const i32));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_epi32(b.add(p * NR + 16) as *const i32));
            let ap = a.add(p * aps);
            for (r, acc) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(r * ars) as i32));
                acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for h in 0..2 {
                // The second half of an edge tile may start past `dst`'s end: its mask is then
                // empty and nothing is read or written, but `add` may not leave the allocation.
                let at = dst.wrapping_add(r * ldc + h * 16);
                let mut v = acc[h];
                if accumulate {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[h], at));
                }
                _mm512_mask_storeu_ps(at, mask[h], v);
            }
        }
    }
}

thread_local! {
    /// Packing buffers, kept per thread so a step's products allocate once.
    static PACKED: std::cell::RefCell<[Vec<u32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)` with bf16 operands and f32 sums, for
/// [`super::matmul`], which checked the operands.
///
/// # Panics
/// If the CPU lacks AVX512_BF16 ([`available`] is false).
pub(crate) fn matmul(p: &Operands, dst: &mut [f32], accumulate: bool) {
    let Operands { m, n, k, a, a_strides, b, b_strides } = *p;
    assert!(available(), "bf16 matmul on a CPU without avx512bf16");
    assert!(dst.len() >= m * n, "matmul: dst too small");
    let kp = k.div_ceil(2);
    PACKED.with_borrow_mut(|[pa, pb, column]| {
        // SAFETY: `available` checked the CPU's features; the packed buffers hold what the
        // packers sized for (m, k) and (k, n); every tile's rows and masked columns lie
        // inside `dst`'s m x n.
        unsafe {
            let a_strides = pack_a(m, k, a, a_strides, pa);
            pack_b(k, n, b, b_strides, pb, column);
            for j in (0..n).step_by(NR) {
                let w = NR.min(n - j);
                let bits = if w == NR { u32::MAX } else { (1u32 << w) - 1 };
                let mask = [bits as u16, (bits >> 16) as u16];
                let panel = pb.as_ptr().add(j / NR * kp * NR);
                for i in (0..m).step_by(MR) {
                    let a0 = pa.as_ptr().add(i * a_strides.0);
                    let out = dst.as_mut_ptr().add(i * n + j);
                    tile(kp, a0, a_strides, panel, out, n, MR.min(m - i), mask, accumulate);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 a bf16 value stands for.
    fn from_bf16(h: u16) -> f32 {
        f32::from_bits((h as u32) << 16)
    }

    /// The product with both operands rounded to bf16, summed in f64: what the kernel computes
    /// up to its f32 sums.
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        sa: (usize, usize),
        b: &[f32],
        sb: (usize, usize),
    ) -> Vec<f64> {
        let q = |x: f32| from_bf16(to_bf16(x)) as f64;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| q(a[i * sa.0 + l * sa.1]) * q(b[l * sb.0 + j * sb.1])).sum();
            }
        }
        c
    }

    #[test]
    fn rounding_is_to_nearest_even_and_keeps_specials() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(to_bf16(f32::MAX), 0x7f80, "beyond bf16's largest rounds to infinity");
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
    }

    #[test]
    fn products_match_bf16_operands_summed_exactly_at_every_layout_and_edge() {
        if !available() {
            eprintln!("skipped: this CPU has no avx512bf16");
            return;
        }
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        // Shapes with odd inner sizes and edges on both sides of the tile; every layout.
        for &(m, n, k) in &[(1, 1, 1), (9, 33, 7), (17, 70, 64), (8, 32, 2), (30, 5, 101)] {
            let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
            for (sa, sb) in [((k, 1), (n, 1)), ((1, m), (n, 1)), ((k, 1), (1, k)), ((1, m), (1, k))] {
                let want = reference(m, n, k, &a, sa, &b, sb);
                for accumulate in [false, true] {
                    let mut got = vec![0.5f32; m * n + 3];
                    matmul(&Operands { m, n, k, a: &a, a_strides: sa, b: &b, b_strides: sb }, &mut got, accumulate);
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let w = w + if accumulate { 0.5 } else { 0.0 };
                        assert!(
                            (g as f64 - w).abs() <= 1e-5 * (k as f64).sqrt(),
                            "{m}x{n}x{k} {sa:?} {sb:?} [{i}]: {g} vs {w}"
                        );
                    }
                    assert_eq!(&got[m * n..], &[0.5; 3], "nothing past the product is written");
                }
            }
        }
    }

    #[test]
    fn operands_really_are_rounded_to_bf16() {
        if !available() {
            eprintln!("skipped: this CPU has no avx512bf16");
            return;
        }
        // 1 + 2^-10 is 1 in bf16: the product is 1, where f32 would give 1.0009766.
        let mut c = [0.0f32];
        let a = [1.0 + 1.0 / 1024.0];
        matmul(&Operands { m: 1, n: 1, k: 1, a: &a, a_strides: (1, 1), b: &[1.0], b_strides: (1, 1) }, &mut c, false);
        assert_eq!(c[0], 1.0);
    }
}
