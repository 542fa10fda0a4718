//! The sizes a model may take: bounds that turn a typo or a hostile job file (a sequence of
//! 10^8 ids, a table of dim 10^8, a batch that needs terabytes) into an error naming the layer
//! or setting, before memory runs out. Without them such a job file made the trainer allocate
//! until the kernel killed it (measured: 24 GiB, then SIGKILL) or wrapped a size.
//!
//! Bounded: a layer's settings, tensors, floats per sample, dense parameters, and a batch (with
//! its threads' replicas) against the memory the process may take: the least of the system's
//! `MemAvailable`, its cgroup's room and what `RLIMIT_AS` leaves ([`available_memory`]).

use crate::nn::layer::Shape;
use crate::nn::{MAX_FIELDS, MAX_TENSOR_FLOATS};

/// Most floats a sample may need over the whole graph: every tensor, its gradient and every
/// layer's workspace (1 GiB).
pub const MAX_SAMPLE_FLOATS: usize = 1 << 28;
/// Most dense parameters a model may have (4 GiB of floats).
pub const MAX_DENSE_PARAMS: usize = 1 << 30;

/// Running totals of a graph's floats per sample and dense parameters, layer by layer.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Budget {
    sample: usize,
    params: usize,
}

impl Budget {
    /// Counts a layer's output (and its gradient), its workspace and its parameters; an error
    /// says which bound the layer passes.
    pub(super) fn add(&mut self, shape: Shape, scratch: usize, params: usize) -> Result<(), String> {
        let size = shape.fields.checked_mul(shape.dim);
        if shape.fields > MAX_FIELDS || size.is_none_or(|n| n > MAX_TENSOR_FLOATS) {
            return Err(format!(
                "its output of {} x {} floats per sample is larger than oar allows (at most {MAX_FIELDS} \
                 vectors and {MAX_TENSOR_FLOATS} floats)",
                shape.fields, shape.dim
            ));
        }
        let size = size.unwrap_or(usize::MAX);
        self.sample = self.sample.saturating_add(size.saturating_mul(2)).saturating_add(scratch);
        if self.sample > MAX_SAMPLE_FLOATS {
            return Err(format!(
                "the model needs {} floats per sample up to this layer (outputs, gradients and workspace; \
                 {scratch} of them this layer's workspace), more than the {MAX_SAMPLE_FLOATS} oar allows",
                self.sample
            ));
        }
        self.params = self.params.saturating_add(params);
        if self.params > MAX_DENSE_PARAMS {
            return Err(format!(
                "the model has {} dense parameters up to this layer, more than the {MAX_DENSE_PARAMS} oar allows",
                self.params
            ));
        }
        Ok(())
    }

    /// Floats a sample needs: outputs, their gradients and the layers' workspace.
    pub(super) fn floats_per_sample(&self) -> usize {
        self.sample
    }
}

/// Checks that batches of `rows` samples on `threads` threads, each needing `per_sample`
/// floats, and a model of `params` dense parameters (with their gradient and an optimizer's
/// state) fit in `available` bytes (`None`: unknown, not checked).
pub fn check_batch(
    per_sample: usize,
    params: usize,
    rows: usize,
    threads: usize,
    available: Option<u64>,
) -> Result<(), String> {
    let Some(available) = available else { return Ok(()) };
    let batch = (per_sample as u64).saturating_mul(rows as u64).saturating_mul(threads as u64).saturating_mul(4);
    let need = batch.saturating_add((params as u64).saturating_mul(16));
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return Err(format!(
            "batches of {rows} samples on {threads} thread(s) need {:.1} GiB ({per_sample} floats per sample) \
             and the dense parameters {:.1} GiB, more than the {:.1} GiB this machine has available: lower \
             batch_size or threads",
            gib(batch),
            gib(need - batch),
            gib(available)
        ));
    }
    Ok(())
}

/// Most steps a local run may hold back with `delay` (delayed updates, a measurement of
/// staleness): each holds its gradients until it is applied.
pub const MAX_DELAY: usize = 1024;

/// Checks that `delay` delayed steps, each holding the gradients of `params` dense parameters,
/// fit in `available` bytes beside what the batches need (`None`: unknown, only the bound).
pub fn check_delay(delay: usize, params: usize, available: Option<u64>) -> Result<(), String> {
    if delay > MAX_DELAY {
        return Err(format!("--delay {delay}: at most {MAX_DELAY} steps may be held back"));
    }
    let need = (delay as u64).saturating_mul(params as u64).saturating_mul(4);
    match available {
        Some(available) if need > available => Err(format!(
            "--delay {delay} holds {delay} steps' gradients of {params} dense parameters ({:.1} GiB), more than \
             the {:.1} GiB available: lower --delay",
            need as f64 / (1u64 << 30) as f64,
            available as f64 / (1u64 << 30) as f64
        )),
        _ => Ok(()),
    }
}

/// The memory this process may still take, in bytes: the least of the machine's
/// (`MemAvailable` of `/proc/meminfo`), its control group's (`memory.max` less
/// `memory.current`, cgroup v2) and its address-space limit's (`RLIMIT_AS` less the address
/// space in use). A job whose estimate fitted the machine aborted under a smaller limit, where
/// it should have been told to lower its batch. `None` where none can be read.
pub fn available_memory() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let machine = read("/proc/meminfo").and_then(|t| meminfo_available(&t));
    let group = match (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        (Some(max), Some(current)) => cgroup_room(&max, &current),
        _ => None,
    };
    let space = read("/proc/self/status").and_then(|status| address_room(rlimit_as()?, &status));
    [machine, group, space].into_iter().flatten().min()
}

fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Room left in a cgroup v2 group: `memory.max` (bytes, or `max`: no limit) less
/// `memory.current`.
fn cgroup_room(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    Some(max.saturating_sub(current.trim().parse().ok()?))
}

/// Room left under an address-space limit of `limit` bytes, less `VmSize` of
/// `/proc/self/status` (in KiB).
fn address_room(limit: u64, status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(limit.saturating_sub(kib.saturating_mul(1024)))
}

/// This process's `RLIMIT_AS` soft limit in bytes (`None`: unlimited or unreadable; `rlim_t` is
/// a u64 on Linux).
fn rlimit_as() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_past_a_bound_is_named_with_the_bound() {
        let mut b = Budget::default();
        b.add(Shape { fields: 50, dim: 16 }, 100, 10).unwrap();
        assert_eq!(b.floats_per_sample(), 2 * 800 + 100);
        let e = b.add(Shape { fields: MAX_FIELDS + 1, dim: 1 }, 0, 0).unwrap_err();
        assert!(e.contains("65536 vectors"), "{e}");
        // A product that overflows is refused, not wrapped.
        let e = b.add(Shape { fields: 2, dim: usize::MAX }, 0, 0).unwrap_err();
        assert!(e.contains("floats"), "{e}");
        let e = b.add(Shape { fields: 1, dim: 8 }, MAX_SAMPLE_FLOATS, 0).unwrap_err();
        assert!(e.contains("floats per sample up to this layer"), "{e}");
        let mut b = Budget::default();
        let e = b.add(Shape::flat(1), 0, MAX_DENSE_PARAMS + 1).unwrap_err();
        assert!(e.contains("dense parameters"), "{e}");
    }

    #[test]
    fn a_batch_that_does_not_fit_the_available_memory_is_refused() {
        // 1000 floats x 256 rows x 2 threads x 4 bytes = 2,048,000 bytes, params 100 x 16.
        let need = 2_048_000 + 1600;
        assert!(check_batch(1000, 100, 256, 2, Some(need)).is_ok());
        let e = check_batch(1000, 100, 256, 2, Some(need - 1)).unwrap_err();
        assert!(e.contains("lower batch_size or threads"), "{e}");
        assert!(check_batch(usize::MAX, usize::MAX, usize::MAX, 2, Some(u64::MAX - 1)).is_err());
        assert!(check_batch(usize::MAX, 0, 1, 1, None).is_ok(), "unknown memory: not checked");
    }

    #[test]
    fn a_control_group_or_an_address_space_limit_bounds_the_memory_available() {
        assert_eq!(cgroup_room("max\n", "1000\n"), None);
        assert_eq!(cgroup_room("4096\n", "1000\n"), Some(3096));
        assert_eq!(cgroup_room("4096\n", "9000\n"), Some(0));
        let status = "Name:\toar\nVmPeak:\t  9000 kB\nVmSize:\t  2000 kB\n";
        assert_eq!(address_room(4 << 20, status), Some((4 << 20) - 2000 * 1024));
        assert_eq!(address_room(1024, status), Some(0));
        // This process's own figure is the least of those it can read.
        let machine = meminfo_available(&std::fs::read_to_string("/proc/meminfo").unwrap());
        assert!(available_memory() <= machine);
    }

    #[test]
    fn a_delay_is_bounded_and_must_fit_in_memory() {
        assert!(check_delay(MAX_DELAY, 1000, None).is_ok());
        assert!(check_delay(MAX_DELAY + 1, 1, None).unwrap_err().contains("at most 1024"));
        let err = check_delay(100, 1 << 20, Some(100 << 20)).unwrap_err();
        assert!(err.contains("lower --delay"), "{err}");
        assert!(check_delay(10, 1 << 20, Some(100 << 20)).is_ok());
    }

    #[test]
    fn meminfo_is_read_in_kib() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_available(text), Some(20_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
        assert_eq!(meminfo_available("MemAvailable: lots kB\n"), None);
    }
}
