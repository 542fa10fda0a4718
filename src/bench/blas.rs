//! A reference BLAS, loaded at run time, for `oar bench --roofline` to measure oar's matrix
//! multiply beside: OpenBLAS by default (Debian's `libopenblas0`), or any library with
//! `cblas_sgemm` that `--blas` names (MKL's `libmkl_rt.so`, BLIS). Loaded with `dlopen`, not
//! linked: oar's build and its other commands need no BLAS, and a machine without one skips the
//! comparison with a message. No crate does this for a library chosen at run time without also
//! linking one at build time (`cblas-sys` and `blas-src` link).

use std::ffi::{c_char, c_int, c_void, CStr, CString};

type Sgemm = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);
type SetThreads = unsafe extern "C" fn(c_int);
type GetConfig = unsafe extern "C" fn() -> *const c_char;

/// CBLAS's constants: row-major storage, and an operand as stored or transposed.
const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// The library `--blas` loads when none is named.
pub const DEFAULT: &str = "libopenblas.so.0";

/// A loaded BLAS: its `cblas_sgemm`, and its thread count where it lets one set it.
pub struct Blas {
    sgemm: Sgemm,
    set_threads: Option<SetThreads>,
    /// The library as named, with what it says of itself (OpenBLAS: its build and kernel).
    pub name: String,
}

// SAFETY: the library's functions are thread-safe (CBLAS is); the handle is never closed.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Blas {
    /// Loads `library` (a file name the loader searches for, or a path). The handle stays open
    /// for the process's life: the functions point into it.
    pub fn load(library: &str) -> Result<Blas, String> {
        let c = CString::new(library).map_err(|_| format!("{library:?}: a NUL in the name"))?;
        // SAFETY: dlopen takes a NUL-terminated name; a library's initializers run, as with any.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("cannot load {library}: {}", dl_error()));
        }
        let sym = |name: &CStr| -> *mut c_void {
            // SAFETY: a valid handle and a NUL-terminated name.
            unsafe { libc::dlsym(handle, name.as_ptr()) }
        };
        let sgemm = sym(c"cblas_sgemm");
        if sgemm.is_null() {
            return Err(format!("{library} has no cblas_sgemm"));
        }
        // SAFETY: the symbols have CBLAS's and OpenBLAS's documented signatures.
        let (sgemm, set_threads, config) = unsafe {
            let set = sym(c"openblas_set_num_threads");
            let config = sym(c"openblas_get_config");
            (
                std::mem::transmute::<*mut c_void, Sgemm>(sgemm),
                (!set.is_null()).then(|| std::mem::transmute::<*mut c_void, SetThreads>(set)),
                (!config.is_null()).then(|| std::mem::transmute::<*mut c_void, GetConfig>(config)),
            )
        };
        let about = config
            // SAFETY: OpenBLAS returns a static NUL-terminated string.
            .map(|f| unsafe { CStr::from_ptr(f()) }.to_string_lossy().trim().to_string())
            .filter(|s| !s.is_empty());
        let name = match about {
            Some(about) => format!("{library} ({about})"),
            None => library.to_string(),
        };
        Ok(Blas { sgemm, set_threads, name })
    }

    /// Sets the library's threads, where it lets one (OpenBLAS).
    pub fn set_threads(&self, threads: usize) {
        if let Some(set) = self.set_threads {
            // SAFETY: OpenBLAS's documented call.
            unsafe { set(threads.min(c_int::MAX as usize) as c_int) };
        }
    }

    /// `dst (m x n) += op(a) op(b)`, row-major, `op` a transpose where `ta` / `tb`: `a` holds
    /// `m x k` (or `k x m` transposed), `b` holds `k x n` (or `n x k`).
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm(&self, m: usize, n: usize, k: usize, dst: &mut [f32], a: &[f32], ta: bool, b: &[f32], tb: bool) {
        assert!(dst.len() >= m * n && a.len() >= m * k && b.len() >= k * n, "sgemm: a buffer is too small");
        let int = |v: usize| c_int::try_from(v).expect("sgemm: a dimension beyond c_int");
        let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
        let op = |t: bool| if t { TRANS } else { NO_TRANS };
        // SAFETY: the assert keeps every element the call reads or writes inside the slices.
        unsafe {
            (self.sgemm)(
                ROW_MAJOR,
                op(ta),
                op(tb),
                int(m),
                int(n),
                int(k),
                1.0,
                a.as_ptr(),
                int(lda.max(1)),
                b.as_ptr(),
                int(ldb.max(1)),
                1.0,
                dst.as_mut_ptr(),
                int(n.max(1)),
            )
        }
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_is_not_there_is_named_in_the_error() {
        let e = Blas::load("liboar-no-such-blas.so").err().unwrap();
        assert!(e.contains("liboar-no-such-blas.so"), "{e}");
        let e = Blas::load("libc.so.6").err().unwrap();
        assert!(e.contains("no cblas_sgemm"), "{e}");
    }

    #[test]
    fn the_reference_agrees_with_oars_matmul_where_one_is_installed() {
        let Ok(blas) = Blas::load(DEFAULT) else {
            eprintln!("skipped: no {DEFAULT} on this machine");
            return;
        };
        let (m, n, k) = (5, 3, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (mut want, mut got) = (vec![1.0f32; m * n], vec![1.0f32; m * n]);
            let sa = if ta { (1, m) } else { (k, 1) };
            let sb = if tb { (1, k) } else { (n, 1) };
            crate::nn::matmul(m, n, k, &mut want, true, &a, sa, &b, sb);
            blas.sgemm(m, n, k, &mut got, &a, ta, &b, tb);
            assert_eq!(want, got, "transposes {ta} {tb}");
        }
    }
}
