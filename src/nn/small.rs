//! Products with every dimension at most [`SMALL`], where gemm's dispatch and packing cost more
//! than the arithmetic: AutoInt's attention multiplies 39 x 8 x 39 per sample and head, 160,000
//! calls a pass of 20,000 lines, and there gemm ran at 0.4-0.7 of OpenBLAS (`oar bench
//! --roofline --model AutoInt+`). Blocks of rows are summed in registers over the whole inner
//! dimension, one fused multiply-add a term, from the right operand's rows: read in place where
//! they are whole vectors of 8, else packed on the stack (a transposed operand column by column,
//! so its reads run in order). The last vector of a row is stored masked, straight into the
//! destination. No buffer is allocated or zeroed a call.
//!
//! A row of the product comes out the same whatever the number of rows `m`, as with gemm; only
//! a product crossing 64 rows (a replica or a sync trainer with a batch of 64 rows or fewer
//! against one with more) changes the order of its sums. On x86-64 with AVX2 and FMA (checked
//! at run time); elsewhere [`matmul`](super::matmul) keeps gemm for these too.

use super::Operands;

/// The largest dimension a small product has.
pub const SMALL: usize = 64;

/// Whether `p` is small enough for [`matmul`] here, and this CPU can run it.
pub(crate) fn fits(p: &Operands) -> bool {
    p.m <= SMALL && p.n <= SMALL && p.k <= SMALL && available()
}

fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `dst (m x n) = [dst +] a b` for a product that [`fits`] (checked: the kernel's registers
/// and stack block hold no more, and it needs the CPU's AVX2 and FMA).
pub(crate) fn matmul(p: &Operands, dst: &mut [f32], accumulate: bool) {
    assert!(fits(p), "a small product of at most {SMALL} in every dimension, on AVX2 and FMA");
    // SAFETY: `fits` checked that this CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        matmul_fma(p, dst, accumulate)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (dst, accumulate);
}

/// The right operand as the kernel reads it: rows of `NV` whole vectors of 8, `stride` floats
/// apart.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Rows {
    at: *const f32,
    stride: usize,
}

/// Reads `b` in place where its rows are whole vectors already, or else packs it into rows of
/// `nv` whole vectors (zeros past `n`) on the stack; then multiplies blocks of rows, as many as
/// keep their sums, `a`'s broadcasts and one of `b`'s vectors in the 16 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn matmul_fma(p: &Operands, dst: &mut [f32], accumulate: bool) {
    let (n, k) = (p.n, p.k);
    let nv = n.div_ceil(8);
    // Written where read (every float of the k rows of nv vectors) before any is read.
    let mut packed = [std::mem::MaybeUninit::<f32>::uninit(); SMALL * SMALL];
    let b = if p.b_strides.1 == 1 && n % 8 == 0 {
        Rows { at: p.b.as_ptr(), stride: p.b_strides.0 }
    } else {
        let width = nv * 8;
        let packed = &mut packed[..k * width];
        for t in 0..k {
            packed[t * width + n..(t + 1) * width].iter_mut().for_each(|v| _ = v.write(0.0));
        }
        if p.b_strides.0 == 1 {
            // Stored transposed: each column is k floats in a row, read in order.
            for j in 0..n {
                let column = &p.b[j * p.b_strides.1..j * p.b_strides.1 + k];
                for (slot, &v) in packed[j..].iter_mut().step_by(width).zip(column) {
                    slot.write(v);
                }
            }
        } else {
            for t in 0..k {
                for j in 0..n {
                    packed[t * width + j].write(p.b[t * p.b_strides.0 + j * p.b_strides.1]);
                }
            }
        }
        Rows { at: packed.as_ptr().cast(), stride: width }
    };
    // SAFETY (each call): this function runs only where AVX2 and FMA are (see `fits`), and
    // `b` holds k rows of nv whole vectors.
    unsafe {
        match nv {
            1 => rows::<6, 1>(p, b, dst, accumulate),
            2 => rows::<4, 2>(p, b, dst, accumulate),
            3 => rows::<3, 3>(p, b, dst, accumulate),
            4 => rows::<3, 4>(p, b, dst, accumulate),
            5 => rows::<2, 5>(p, b, dst, accumulate),
            6 => rows::<2, 6>(p, b, dst, accumulate),
            7 => rows::<1, 7>(p, b, dst, accumulate),
            _ => rows::<1, 8>(p, b, dst, accumulate),
        }
    }
}

/// Every row of the product, `MR` at a time, then the rest as one smaller block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows<const MR: usize, const NV: usize>(p: &Operands, b: Rows, dst: &mut [f32], accumulate: bool) {
    let mut i = 0;
    while i + MR <= p.m {
        block::<MR, NV>(p, i, b, dst, accumulate);
        i += MR;
    }
    // A row alone would wait on each of its sums' additions in turn.
    match p.m - i {
        0 => {}
        1 => block::<1, NV>(p, i, b, dst, accumulate),
        2 => block::<2, NV>(p, i, b, dst, accumulate),
        3 => block::<3, NV>(p, i, b, dst, accumulate),
        4 => block::<4, NV>(p, i, b, dst, accumulate),
        _ => block::<5, NV>(p, i, b, dst, accumulate),
    }
}

/// Rows `i0..i0 + MR` of the product: sums in registers over the whole inner dimension.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const MR: usize, const NV: usize>(p: &Operands, i0: usize, b: Rows, dst: &mut [f32], accumulate: bool) {
    use std::arch::x86_64::*;
    let (n, (rs, cs)) = (p.n, p.a_strides);
    debug_assert!(p.a.len() > (i0 + MR - 1) * rs + (p.k - 1) * cs);
    let a = p.a.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    for t in 0..p.k {
        // SAFETY: `matmul` checked that `a` holds every (row, t) of the product and `b` holds
        // k rows of NV vectors.
        unsafe {
            let mut av = [_mm256_setzero_ps(); MR];
            for (r, v) in av.iter_mut().enumerate() {
                *v = _mm256_broadcast_ss(&*a.add((i0 + r) * rs + t * cs));
            }
            let brow = b.at.add(t * b.stride);
            for v in 0..NV {
                let bv = _mm256_loadu_ps(brow.add(v * 8));
                for (sums, a) in acc.iter_mut().zip(&av) {
                    sums[v] = _mm256_fmadd_ps(*a, bv, sums[v]);
                }
            }
        }
    }
    // Stored straight into the destination, the last vector of a row masked to its width.
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (r, sums) in acc.iter().enumerate() {
        let out = &mut dst[(i0 + r) * n..(i0 + r + 1) * n];
        for (v, sum) in sums.iter().enumerate() {
            let at = out[v * 8..].as_mut_ptr();
            let left = n - v * 8;
            // SAFETY: `out` holds `left` floats from `at`; whole vectors only where 8 remain.
            unsafe {
                if left >= 8 {
                    let old = if accumulate { _mm256_loadu_ps(at) } else { _mm256_setzero_ps() };
                    _mm256_storeu_ps(at, _mm256_add_ps(old, *sum));
                } else {
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left as i32), lanes);
                    let old = if accumulate { _mm256_maskload_ps(at, mask) } else { _mm256_setzero_ps() };
                    _mm256_maskstore_ps(at, mask, _mm256_add_ps(old, *sum));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_products_equal_sums_in_f64_in_every_layout() {
        if !available() {
            eprintln!("no AVX2 and FMA here: small products stay with gemm");
            return;
        }
        // Every width (each tile and masked tail), the attention heads' shapes, the largest.
        let shapes =
            (1..=SMALL).map(|n| (7, n, 5)).chain([(1, 1, 1), (39, 8, 39), (39, 39, 8), (64, 64, 64), (2, 64, 1)]);
        for (m, n, k) in shapes {
            for (ta, tb, accumulate) in
                [(false, false, false), (true, false, true), (false, true, false), (true, true, true)]
            {
                // Rows wider than the product, as an attention head's columns of a wider matrix.
                let (ra, rb) = (if ta { m + 3 } else { k + 2 }, if tb { k + 1 } else { n + 8 });
                let a: Vec<f32> = (0..m.max(k) * ra).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
                let b: Vec<f32> = (0..k.max(n) * rb).map(|i| ((i * 53 % 97) as f32 - 48.0) / 32.0).collect();
                let sa = if ta { (1, ra) } else { (ra, 1) };
                let sb = if tb { (1, rb) } else { (rb, 1) };
                let p = Operands { m, n, k, a: &a, a_strides: sa, b: &b, b_strides: sb };
                let mut dst: Vec<f32> = (0..m * n + 3).map(|i| i as f32).collect();
                let before = dst.clone();
                matmul(&p, &mut dst, accumulate);
                for i in 0..m {
                    for j in 0..n {
                        let sum: f64 =
                            (0..k).map(|t| a[i * sa.0 + t * sa.1] as f64 * b[t * sb.0 + j * sb.1] as f64).sum();
                        let want = sum + if accumulate { before[i * n + j] as f64 } else { 0.0 };
                        let got = dst[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{m}x{n}x{k} ({i}, {j}): {got} {want}"
                        );
                    }
                }
                assert_eq!(dst[m * n..], before[m * n..], "nothing past the product is written");
            }
        }
    }
}
