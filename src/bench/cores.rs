//! Which cores a measurement runs on. `oar bench` (b) puts its server on one core and the
//! client, with the table in memory it is compared against, on another, as a server and a
//! trainer are placed on separate hosts. Left to the scheduler on a small machine, the two
//! wake each other onto one core, or the server's thread moves between cores and finds the
//! table's hot rows in the other core's cache: unique pulls ran at 0.45 of the table in memory
//! where placed they ran at 0.69 (one run each; 1.09-1.16x in alternating pairs of runs; 2-core
//! Intel Xeon VM, 2026-12-01). Where the first and the last core are two threads of one
//! physical core (SMT), the two still share that core's caches.

use std::io;
use std::process::Command;

/// The cores of a placed measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    /// The server process's core.
    pub(super) server: usize,
    /// The measuring thread's core (the client, and the table in memory).
    pub(super) client: usize,
}

impl Placement {
    /// The first and the last core of `allowed`; `None` with fewer than two.
    pub(super) fn of(allowed: &[usize]) -> Option<Placement> {
        match (allowed.first(), allowed.last()) {
            (Some(&client), Some(&server)) if client != server => Some(Placement { server, client }),
            _ => None,
        }
    }

    /// The placement on the cores this process may use, if it may use two.
    pub(super) fn here() -> io::Result<Option<Placement>> {
        Ok(Placement::of(&allowed()?))
    }
}

/// The cores this thread may run on, in increasing order.
fn allowed() -> io::Result<Vec<usize>> {
    let set = get()?;
    // SAFETY: CPU_ISSET reads a bit of a set that sched_getaffinity filled, for indices below
    // the set's size.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

fn get() -> io::Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) {
            0 => Ok(set),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

fn set(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: pid 0 is the calling thread; the set is a valid cpu_set_t of the given size.
    match unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

fn only(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` comes from `allowed`, so it lies
    // inside the set (CPU_SET panics on an index beyond it).
    unsafe {
        let mut s: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut s);
        s
    }
}

/// The calling thread held on one core until dropped, when it gets its cores back.
pub(super) struct Pinned(libc::cpu_set_t);

impl Pinned {
    /// Holds the calling thread on `cpu`.
    pub(super) fn on(cpu: usize) -> io::Result<Pinned> {
        let before = get()?;
        set(&only(cpu))?;
        Ok(Pinned(before))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Err(e) = set(&self.0) {
            tracing::warn!("could not give the benchmark thread its cores back: {e}");
        }
    }
}

/// Makes `command`'s process start on `cpu` only, with every thread it makes.
pub(super) fn start_on(command: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    let chosen = only(cpu);
    // SAFETY: sched_setaffinity is a system call, safe between fork and exec; the closure only
    // reads a set made before the fork.
    unsafe {
        command.pre_exec(move || set(&chosen));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_takes_the_last_core_and_the_client_the_first() {
        assert_eq!(Placement::of(&[0, 1]), Some(Placement { server: 1, client: 0 }));
        assert_eq!(Placement::of(&[2, 5, 7]), Some(Placement { server: 7, client: 2 }));
        assert_eq!(Placement::of(&[3]), None);
        assert_eq!(Placement::of(&[]), None);
    }

    #[test]
    fn a_pinned_thread_runs_on_its_core_and_gets_its_cores_back() {
        let before = allowed().unwrap();
        let Some(p) = Placement::of(&before) else {
            eprintln!("skipped: this process may use one core only");
            return;
        };
        {
            let _pinned = Pinned::on(p.server).unwrap();
            assert_eq!(allowed().unwrap(), vec![p.server]);
        }
        assert_eq!(allowed().unwrap(), before);
    }
}
