//! The arithmetic peak of one core: f32 fused multiply-adds and bf16 pair products
//! (`vdpbf16ps`), each timed in a loop of independent operations on registers, so neither
//! memory nor latency bounds it. `oar bench --roofline` prints them above the matrix products,
//! because a CPU's bf16 instruction is not always faster than its f32 one (on an Intel Xeon
//! with AVX512_BF16 here, `vdpbf16ps` did 85 GFLOP/s a core against 184 for f32 FMA).

use std::time::Instant;

/// Independent accumulators per loop: more than latency x throughput of either instruction.
const CHAINS: usize = 16;

/// FLOP/s of one core doing f32 FMAs at the widest width it has (512, 256 bits or scalar).
pub fn f32_fma(seconds: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has avx512f.
        return timed(seconds, 16 * CHAINS, |n| unsafe { x86::fma512(n) });
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has fma (and so avx).
        return timed(seconds, 8 * CHAINS, |n| unsafe { x86::fma256(n) });
    }
    timed(seconds, CHAINS, scalar_fma)
}

/// FLOP/s of one core doing bf16 pair products (`vdpbf16ps` on 512 bits: 32 multiply-adds
/// an instruction), where the CPU has them.
pub fn bf16_dot(seconds: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::nn::bf16_available() {
        // SAFETY: the CPU has avx512f and avx512bf16.
        return Some(timed(seconds, 32 * CHAINS, |n| unsafe { x86::dpbf16(n) }));
    }
    let _ = seconds;
    None
}

/// FLOP/s of `run(n)`, which does `n` rounds of `per_round` multiply-adds, over calls filling
/// `seconds`; `black_box` keeps its result, so the loop is not removed.
fn timed(seconds: f64, per_round: usize, run: impl Fn(usize) -> f32) -> f64 {
    const ROUNDS: usize = 1 << 20;
    std::hint::black_box(run(ROUNDS / 16));
    let started = Instant::now();
    let mut calls = 0usize;
    while calls < 2 || started.elapsed().as_secs_f64() < seconds {
        std::hint::black_box(run(ROUNDS));
        calls += 1;
    }
    2.0 * (calls * ROUNDS * per_round) as f64 / started.elapsed().as_secs_f64()
}

fn scalar_fma(n: usize) -> f32 {
    let mut acc = [0.0f32; CHAINS];
    let (a, b) = (std::hint::black_box(1.0f32), std::hint::black_box(1e-3f32));
    for _ in 0..n {
        acc.iter_mut().for_each(|c| *c = a.mul_add(b, *c));
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) fn fma512(n: usize) -> f32 {
        let (a, b) = (_mm512_set1_ps(std::hint::black_box(1.0)), _mm512_set1_ps(1e-3));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..n {
            acc.iter_mut().for_each(|c| *c = _mm512_fmadd_ps(a, b, *c));
        }
        acc.iter().map(|&c| _mm512_reduce_add_ps(c)).sum()
    }

    #[target_feature(enable = "avx,fma")]
    pub(super) fn fma256(n: usize) -> f32 {
        let (a, b) = (_mm256_set1_ps(std::hint::black_box(1.0)), _mm256_set1_ps(1e-3));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..n {
            acc.iter_mut().for_each(|c| *c = _mm256_fmadd_ps(a, b, *c));
        }
        let mut lanes = [0.0f32; 8];
        let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &c| _mm256_add_ps(s, c));
        // SAFETY: `lanes` holds the 8 floats the store writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum()
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn dpbf16(n: usize) -> f32 {
        // Pairs of bf16 1.0 and 2^-7, as 32-bit lanes.
        let one = _mm512_set1_epi32(std::hint::black_box(0x3f80_3f80));
        let small = _mm512_set1_epi32(0x3c00_3c00);
        // SAFETY: __m512i and __m512bh are the same 64 bytes.
        let (a, b): (__m512bh, __m512bh) =
            unsafe { (std::mem::transmute::<__m512i, __m512bh>(one), std::mem::transmute::<__m512i, __m512bh>(small)) };
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..n {
            acc.iter_mut().for_each(|c| *c = _mm512_dpbf16_ps(*c, a, b));
        }
        acc.iter().map(|&c| _mm512_reduce_add_ps(c)).sum()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peaks_are_positive_and_bf16_is_there_only_where_the_cpu_has_it() {
        assert!(super::f32_fma(0.01) > 0.0);
        assert_eq!(super::bf16_dot(0.01).is_some(), crate::nn::bf16_available());
    }
}
