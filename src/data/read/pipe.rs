//! A data file piped through a `pipe_command` (PaddlePaddle's dataset option), with the command
//! kept on a leash: it runs in a process group of its own so all of it (a pipeline, the
//! processes a script starts) can be killed at once; it is killed when the reader stops early
//! (a bad line, the trainer gone); and a command that prints nothing for `silence` is killed
//! and named, where the trainer would otherwise wait for it forever.
//!
//! The silence is measured only while the reader waits on the command's output, never while it
//! waits for the trainer to take a batch, so a trainer held at a barrier does not time its own
//! data source out.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

/// Default longest silence of a `pipe_command` (seconds): far longer than a decompressor or a
/// PaddleRec generator takes between lines, short enough that a hung command is named the same
/// day.
pub const DEFAULT_SILENCE_SECS: u64 = 300;

/// Longest silence a job may allow (a day).
pub const MAX_SILENCE_SECS: u64 = 86_400;

/// A running `pipe_command` over one file.
pub(super) struct Pipe {
    child: Child,
    errors: Option<JoinHandle<String>>,
}

/// The command's standard output, whose reads fail with `TimedOut` after `silence` without a
/// byte (or the end).
pub(super) struct Output {
    stdout: ChildStdout,
    silence: Duration,
    /// Whether a read timed out (the error the reader returns is then the pipe's, not I/O's).
    pub(super) timed_out: bool,
}

impl Pipe {
    /// Starts `sh -c command` with `file` on its standard input.
    pub(super) fn spawn(command: &str, file: std::fs::File, silence: Duration) -> std::io::Result<(Pipe, Output)> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        // Drained on its own thread so a chatty command cannot block on a full stderr pipe.
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Ok((Pipe { child, errors: Some(errors) }, Output { stdout, silence, timed_out: false }))
    }

    /// Kills the command and every process of its group.
    pub(super) fn kill(&mut self) {
        // The group's id is the shell's pid (`process_group(0)`); a group already gone is fine.
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: a signal to our own child's process group; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }

    /// Waits for the command, at most `silence` (one that closed its output but goes on is
    /// killed); `Err` holds how it failed (its status and last line of stderr).
    pub(super) fn finish(mut self, silence: Duration) -> std::io::Result<Result<(), String>> {
        let deadline = std::time::Instant::now() + silence;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() >= deadline {
                self.kill();
                self.child.wait()?;
                return Ok(Err(format!(
                    "closed its output but was still running {} s later and was killed",
                    silence.as_secs_f64()
                )));
            }
            // The usual command exits as its output ends: the first look or the next finds it.
            std::thread::sleep(Duration::from_millis(5));
        };
        // What the command left running in the background dies with it: it would hold stderr
        // open (and the drain below with it) and outlive the job.
        self.kill();
        let errors = self.errors.take().map(|e| e.join().unwrap_or_default()).unwrap_or_default();
        if status.success() {
            return Ok(Ok(()));
        }
        let last = errors.lines().last().unwrap_or("").trim();
        Ok(Err(if last.is_empty() { format!("failed ({status})") } else { format!("failed ({status}): {last}") }))
    }
}

impl Read for Output {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let ms = self.silence.as_millis().min(i32::MAX as u128) as i32;
        loop {
            let mut fd = libc::pollfd { fd: self.stdout.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            match unsafe { libc::poll(&mut fd, 1, ms) } {
                0 => {
                    self.timed_out = true;
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the pipe_command went silent"));
                }
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                _ => return self.stdout.read(buf),
            }
        }
    }
}

/// What a silent command's error says.
pub(super) fn silence_message(silence: Duration) -> String {
    format!(
        "printed nothing for {} s and was killed (a slower command needs a longer [data] pipe_timeout)",
        silence.as_secs()
    )
}

/// Checks a job's `pipe_timeout`.
pub fn check_silence(secs: u64) -> Result<(), String> {
    if !(1..=MAX_SILENCE_SECS).contains(&secs) {
        return Err(format!("[data] pipe_timeout is {secs} s: it must be in 1..={MAX_SILENCE_SECS} (a day)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(command: &str, input: &str, silence_ms: u64) -> (Result<String, std::io::Error>, bool, Result<(), String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in");
        std::fs::write(&path, input).unwrap();
        let (mut pipe, mut out) =
            Pipe::spawn(command, std::fs::File::open(&path).unwrap(), Duration::from_millis(silence_ms)).unwrap();
        let mut text = String::new();
        let read = out.read_to_string(&mut text).map(|_| text);
        if read.is_err() {
            pipe.kill();
        }
        let status = pipe.finish(Duration::from_millis(silence_ms)).unwrap();
        (read, out.timed_out, status)
    }

    #[test]
    fn a_command_is_read_to_its_end_and_its_failure_described() {
        let (read, timed_out, status) = run("tr a-z A-Z", "abc\n", 10_000);
        assert_eq!((read.unwrap(), timed_out, status), ("ABC\n".to_string(), false, Ok(())));
        let (_, _, status) = run("echo boom >&2; exit 3", "", 10_000);
        let err = status.unwrap_err();
        assert!(err.contains("exit status: 3") && err.ends_with("boom"), "{err}");
    }

    #[test]
    fn a_silent_pipeline_is_killed_whole() {
        // A pipeline: killing only the shell would leave `sleep` holding the pipe open. The
        // group is killed, so `finish` returns (the test would hang otherwise) and says so.
        let (read, timed_out, status) = run("echo first; sleep 600 | cat", "", 200);
        assert!(timed_out);
        assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert!(status.unwrap_err().contains("signal: 9"));
        assert!(check_silence(0).is_err() && check_silence(MAX_SILENCE_SECS + 1).is_err());
        assert!(check_silence(DEFAULT_SILENCE_SECS).is_ok());
    }

    #[test]
    fn a_command_that_closes_its_output_and_stays_is_killed() {
        let (read, timed_out, status) = run("cat; exec >&-; sleep 6019", "x\n", 300);
        assert_eq!((read.unwrap(), timed_out), ("x\n".to_string(), false));
        assert!(status.unwrap_err().starts_with("closed its output but was still running 0.3 s later"));
    }
}
