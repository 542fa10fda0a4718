//! Reading and writing the small files a restart trusts (a server's `fence.json`,
//! `trainers.json`, a checkpoint's `entry.json`, a trainer's position record): every one is
//! hostile until checked. Reads open the file without following a symbolic link and without
//! blocking (a named pipe would hang the process at start), accept only a regular file, and
//! refuse one larger than any file oar writes there before reading it. Writes go to a fresh
//! temporary file in the same folder, are synced, renamed over the old one and the folder is
//! synced, so a crash leaves the old file or the new one, never a torn one, and a symbolic
//! link planted at the path is replaced, never followed. Counters read back are range-checked
//! ([`bounded`]): one near `u64::MAX` would wrap.
//!
//! Also here, the other files oar opens by name. Outputs written as they go (logs, generated
//! parts, curves) are opened by [`create_plain`] and [`append_plain`]: never through a link,
//! never a named pipe or a device. Files a user names (a job file, a hosts file, statistics, a
//! PEM file) are read by [`read_named`], the one reader of them: a link is followed, as the user
//! chose the path, but only a regular file within a size is read, never a pipe or a device;
//! [`read_private`], for a secret or a private key, also refuses a file others may read.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a state file could not be read or written; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file could not be opened, read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// Not a regular file (a symbolic link, a named pipe, a folder, a device).
    #[error("{path}: not a regular file ({kind}): refused")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// Larger than any file oar writes there.
    #[error("{path}: {bytes} bytes, more than the {max} such a file can hold: refused")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The most it may hold.
        max: u64,
    },
    /// Read, but its content is not what oar writes there.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl StateFileError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateFileError + '_ {
        move |cause| StateFileError::Io { path: path.to_path_buf(), cause }
    }

    /// An error for content read from `path`.
    pub fn invalid(path: &Path, reason: impl Into<String>) -> StateFileError {
        StateFileError::Invalid { path: path.to_path_buf(), reason: reason.into() }
    }

    /// What is wrong, without the path (for callers whose own error names it).
    pub fn reason(&self) -> String {
        let full = self.to_string();
        let path = match self {
            StateFileError::Io { path, .. }
            | StateFileError::NotRegular { path, .. }
            | StateFileError::TooLarge { path, .. }
            | StateFileError::Invalid { path, .. } => path,
        };
        full.strip_prefix(&format!("{}: ", path.display())).unwrap_or(&full).to_string()
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_symlink() => "a symbolic link",
        _ if t.is_dir() => "a folder",
        _ if t.is_fifo() => "a named pipe",
        _ if t.is_socket() => "a socket",
        _ if t.is_block_device() || t.is_char_device() => "a device",
        _ => "not a file",
    }
}

/// Opens `path` for reading (or also writing) as a state file: no symbolic link followed, no
/// wait on a named pipe, only a regular file. `Ok(None)` if there is none.
pub fn open(path: &Path, write: bool) -> Result<Option<std::fs::File>, StateFileError> {
    Ok(open_checked(path, write)?.map(|(file, _)| file))
}

/// [`open`], with the file's size (from the same `fstat` that found it regular).
pub fn open_sized(path: &Path, write: bool) -> Result<Option<(std::fs::File, u64)>, StateFileError> {
    open_checked(path, write)
}

fn open_checked(path: &Path, write: bool) -> Result<Option<(std::fs::File, u64)>, StateFileError> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW on a link fails with ELOOP: say what it is.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(StateFileError::NotRegular { path: path.to_path_buf(), kind: "a symbolic link" })
        }
        Err(e) => return Err(StateFileError::io(path)(e)),
    };
    let meta = file.metadata().map_err(StateFileError::io(path))?;
    if !meta.file_type().is_file() {
        return Err(StateFileError::NotRegular { path: path.to_path_buf(), kind: kind_of(&meta) });
    }
    Ok(Some((file, meta.size())))
}

/// Reads the state file at `path`, at most `max` bytes; `Ok(None)` if there is none.
pub fn read(path: &Path, max: u64) -> Result<Option<Vec<u8>>, StateFileError> {
    let Some((file, bytes)) = open_checked(path, false)? else { return Ok(None) };
    if bytes > max {
        return Err(StateFileError::TooLarge { path: path.to_path_buf(), bytes, max });
    }
    let mut data = Vec::with_capacity(bytes as usize);
    // `take`: a file that grows while read is still read no further than its bound.
    file.take(max + 1).read_to_end(&mut data).map_err(StateFileError::io(path))?;
    if data.len() as u64 > max {
        return Err(StateFileError::TooLarge { path: path.to_path_buf(), bytes: data.len() as u64, max });
    }
    Ok(Some(data))
}

/// Reads a file the user named (a job file): a symbolic link is followed, as the user chose
/// the path, but only a regular file of at most `max` bytes is read; a named pipe is refused
/// without waiting for a writer, and a device (`/dev/zero`) without reading it.
pub fn read_named(path: &Path, max: u64) -> Result<Vec<u8>, StateFileError> {
    read_user_file(path, max, false)
}

/// Reads a file holding a secret the user named (the job's secret, a TLS private key) as
/// [`read_named`] does, refusing one that others than its owner may read or write, as ssh
/// refuses such a key: a secret anyone on the machine can read guards nothing.
pub fn read_private(path: &Path, max: u64) -> Result<Vec<u8>, StateFileError> {
    read_user_file(path, max, true)
}

fn read_user_file(path: &Path, max: u64, private: bool) -> Result<Vec<u8>, StateFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(StateFileError::io(path))?;
    let meta = file.metadata().map_err(StateFileError::io(path))?;
    if !meta.file_type().is_file() {
        return Err(StateFileError::NotRegular { path: path.to_path_buf(), kind: kind_of(&meta) });
    }
    if private && meta.mode() & 0o077 != 0 {
        let mode = meta.mode() & 0o777;
        return Err(StateFileError::invalid(
            path,
            format!("others than its owner may read or write it (mode {mode:o}): make it private (chmod 600)"),
        ));
    }
    if meta.size() > max {
        return Err(StateFileError::TooLarge { path: path.to_path_buf(), bytes: meta.size(), max });
    }
    let mut data = Vec::with_capacity(meta.size() as usize);
    file.take(max + 1).read_to_end(&mut data).map_err(StateFileError::io(path))?;
    if data.len() as u64 > max {
        return Err(StateFileError::TooLarge { path: path.to_path_buf(), bytes: data.len() as u64, max });
    }
    Ok(data)
}

/// Reads and parses the JSON state file at `path` (at most `max` bytes).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, max: u64) -> Result<Option<T>, StateFileError> {
    match read(path, max)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StateFileError::invalid(path, format!("not a file oar wrote ({e})"))),
    }
}

/// Syncs folder `dir`, making a rename or a creation in it durable.
pub fn sync_dir(dir: &Path) -> Result<(), StateFileError> {
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(StateFileError::io(dir))
}

/// Creates a new file at `path` with permissions `mode` for writing: never over an existing
/// file and never through a link.
pub fn create_new(path: &Path, mode: u32) -> Result<std::fs::File, StateFileError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(StateFileError::io(path))
}

/// Opens `path` to write it from its start (created, or emptied), never through a symbolic link
/// and never a named pipe or a device: a link planted at an output's name (a log, a generated
/// part) had the output written into whatever it named.
pub fn create_plain(path: &Path) -> Result<std::fs::File, StateFileError> {
    let file = open_plain(path, false)?;
    file.set_len(0).map_err(StateFileError::io(path))?;
    Ok(file)
}

/// Opens `path` to append to it (created if absent), as [`create_plain`] opens.
pub fn append_plain(path: &Path) -> Result<std::fs::File, StateFileError> {
    open_plain(path, true)
}

fn open_plain(path: &Path, append: bool) -> Result<std::fs::File, StateFileError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .append(append)
        .create(true)
        .mode(0o644)
        // Non-blocking: opening a named pipe for writing would wait for a reader.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => StateFileError::invalid(path, "a symbolic link: oar does not write through one"),
            // What a non-blocking open for writing of a named pipe with no reader gives.
            Some(libc::ENXIO) => StateFileError::invalid(path, "a named pipe: oar writes only regular files"),
            _ => StateFileError::io(path)(e),
        })?;
    let meta = file.metadata().map_err(StateFileError::io(path))?;
    if !meta.file_type().is_file() {
        return Err(StateFileError::NotRegular { path: path.to_path_buf(), kind: kind_of(&meta) });
    }
    Ok(file)
}

/// Writes `bytes` durably into a new file at `path` ([`create_new`]) with permissions `mode`.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateFileError> {
    let mut f = create_new(path, mode)?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(StateFileError::io(path))
}

/// Replaces the file at `path` with `bytes` atomically and durably (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| StateFileError::invalid(path, "no file name"))?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id()));
    let write = || -> Result<(), StateFileError> {
        let mut f = create_new(&tmp, 0o644)?;
        f.write_all(bytes).and_then(|_| f.sync_all()).map_err(StateFileError::io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(StateFileError::io(path))?;
        sync_dir(dir)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Whether `path` is `folder` or lies under it, compared as real paths (links resolved; a
/// path that does not exist yet as its absolute form).
pub fn is_within(path: &Path, folder: &Path) -> bool {
    let real =
        |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| std::path::absolute(p).unwrap_or(p.to_path_buf()));
    real(path).starts_with(real(folder))
}

/// Checks that a tool may put its output at `out` by renaming over it: nothing there, a regular
/// file, or a link to a file in the same folder (the link is replaced, not what it names; a
/// link elsewhere, such as `/dev/stdout`, is refused: run as root, `oar predict` replaced
/// `/dev/stdout` with a file), and none of `inputs` (the same file under any name). `oar plot
/// --out` and `oar data stats --out` replaced their own input, a device or a named pipe without
/// a word.
pub fn check_output(out: &Path, inputs: &[&Path]) -> Result<(), StateFileError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(out) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StateFileError::io(out)(e)),
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(out).map_err(StateFileError::io(out))?;
        let folder = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let named = folder.join(&target);
        let same = |p: &Path| p.canonicalize().ok();
        if named.parent().and_then(same).is_some_and(|f| Some(f) == same(folder)) {
            return Ok(());
        }
        let why = format!(
            "is a symbolic link to {}, outside its own folder: it is never replaced (name the file itself, or \
             --out - for standard output where a command takes it)",
            target.display()
        );
        return Err(StateFileError::invalid(out, why));
    }
    if !meta.is_file() {
        return Err(StateFileError::invalid(out, format!("{} is there, not a file to replace", kind_of(&meta))));
    }
    for input in inputs {
        if std::fs::metadata(input).is_ok_and(|i| (i.dev(), i.ino()) == (meta.dev(), meta.ino())) {
            return Err(StateFileError::invalid(
                out,
                format!("is the input {}: writing there would replace it; name another file", input.display()),
            ));
        }
    }
    Ok(())
}

/// Writes `value` as JSON to `path` with [`write_atomic`].
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    write_atomic(path, &serde_json::to_vec_pretty(value).expect("state files serialize"))
}

/// Refuses a number from a state file above `max`: a counter near `u64::MAX` would wrap.
pub fn bounded(path: &Path, what: &str, value: u64, max: u64) -> Result<u64, StateFileError> {
    if value > max {
        return Err(StateFileError::invalid(path, format!("{what} {value} is beyond any this job can reach ({max})")));
    }
    Ok(value)
}

/// The most updates, epochs or steps a counter in a state file may hold: 2^48, far beyond any
/// run, far below where adding to it could wrap.
pub const COUNTER_MAX: u64 = 1 << 48;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_may_replace_a_file_or_a_link_but_not_its_input_a_device_or_a_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let (input, out, link) = (dir.path().join("in"), dir.path().join("out"), dir.path().join("link"));
        std::fs::write(&input, "x").unwrap();
        check_output(&out, &[&input]).unwrap();
        std::fs::write(&out, "old").unwrap();
        check_output(&out, &[&input]).unwrap();
        std::os::unix::fs::symlink(&input, &link).unwrap();
        check_output(&link, &[&input]).unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&input, &hard).unwrap();
        let err = check_output(&hard, &[&input]).unwrap_err().to_string();
        assert!(err.contains("is the input") && err.contains("would replace it"), "{err}");
        assert!(check_output(Path::new("/dev/null"), &[]).unwrap_err().to_string().contains("a device is there"));
        assert!(check_output(dir.path(), &[]).unwrap_err().to_string().contains("a folder is there"));
    }

    #[test]
    fn reads_refuse_links_pipes_folders_and_oversized_files_and_writes_replace_links() {
        let dir = tempfile::tempdir().unwrap();
        let (file, outside) = (dir.path().join("fence.json"), dir.path().join("outside"));
        assert!(read(&file, 100).unwrap().is_none(), "none yet");
        write_atomic(&file, b"{}").unwrap();
        assert_eq!(read(&file, 100).unwrap().unwrap(), b"{}");
        let e = read(&file, 1).unwrap_err().to_string();
        assert!(e.contains("2 bytes, more than the 1"), "{e}");

        std::fs::write(&outside, b"keep").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
        let e = read(&file, 100).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        write_atomic(&file, b"new").unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep", "the link's target was not written");
        assert!(!std::fs::symlink_metadata(&file).unwrap().file_type().is_symlink(), "the link was replaced");

        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = read(&fifo, 100).unwrap_err().to_string();
        assert!(e.contains("a named pipe"), "{e}");
        let e = read(dir.path(), 100).unwrap_err().to_string();
        assert!(e.contains("a folder"), "{e}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary file left");
        assert!(bounded(&file, "epoch", u64::MAX, COUNTER_MAX).unwrap_err().to_string().contains("epoch"));
    }

    #[test]
    fn a_named_file_is_read_through_a_link_but_never_a_pipe_a_device_or_too_much() {
        let dir = tempfile::tempdir().unwrap();
        let (target, link) = (dir.path().join("job.toml"), dir.path().join("link"));
        std::fs::write(&target, b"abc").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read_named(&link, 3).unwrap(), b"abc", "a link the user named is followed");
        let e = read_named(&target, 2).unwrap_err();
        assert_eq!(e.reason(), "3 bytes, more than the 2 such a file can hold: refused");
        let e = read_named(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "/dev/zero: not a regular file (a device): refused");
        assert_eq!(e.reason(), "not a regular file (a device): refused");
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // Returns at once, though no one will ever write to the pipe.
        assert!(read_named(&fifo, 100).unwrap_err().to_string().contains("a named pipe"));
        assert!(read_named(&dir.path().join("none"), 100).unwrap_err().to_string().contains("none: No such file"));
    }
}
