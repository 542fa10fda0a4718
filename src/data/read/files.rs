//! Which files a path names and which of them a trainer reads: listing a file, a folder or a `*`
//! pattern ([`list_files`]; links inside a folder are not followed), each trainer's share by the
//! files' numeric suffix (`suffix % trainers`, [`shard_files`]), files opened only if regular
//! ([`open_regular`]), and `oar split`'s parts ([`split_file`], streaming a buffer at a time, so a
//! line of any length costs no memory; [`check_parts`]).

use std::path::{Path, PathBuf};

/// The data files named by `path`: the file itself, the regular files of a folder in name
/// order (hidden files and `.json` metadata skipped), or the files a `*` pattern in the last
/// component matches (as `oar split` writes them: `train.txt-*`). Symbolic links inside a
/// folder are not followed (a link planted in a data folder must not make a trainer read, and
/// quote in its errors, a file elsewhere); skipping them is logged, and said when nothing is left.
pub fn list_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some((prefix, suffix)) = name.split_once('*') {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.len() >= prefix.len() + suffix.len()
                    && n.starts_with(prefix)
                    && n.ends_with(suffix)
                    && e.file_type().is_ok_and(|t| t.is_file())
            })
            .map(|e| e.path())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no file matches", path.display()),
            ));
        }
        return Ok(files);
    }
    let meta =
        std::fs::metadata(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !meta.is_dir() {
        // Reading a named pipe or a device as a file would block on a pipe without a writer, or
        // read forever from /dev/zero; listing it as a folder failed with "Not a directory".
        return Err(not_data(path, &meta.file_type(), "a regular file or a folder"));
    }
    let (mut files, mut links, mut special) = (Vec::new(), 0usize, 0usize);
    for entry in
        std::fs::read_dir(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type()?;
        links += kind.is_symlink() as usize;
        special += !(kind.is_file() || kind.is_dir() || kind.is_symlink()) as usize;
        if name.starts_with('.') || name.ends_with(".json") || !kind.is_file() {
            continue;
        }
        files.push(entry.path());
    }
    files.sort();
    if links > 0 {
        tracing::warn!(folder = %path.display(), links, "symbolic links in a data folder are not followed");
    }
    if special > 0 {
        // A named pipe left among the parts was skipped without a word: its data never read.
        tracing::warn!(folder = %path.display(), special, "named pipes, devices and sockets in a data folder are not read");
    }
    if files.is_empty() {
        let skipped = match (links, special) {
            (0, 0) => String::new(),
            (l, s) => format!(
                " ({l} symbolic link(s) and {s} named pipe(s), device(s) or socket(s) skipped: data is read only from \
                 regular files)"
            ),
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: folder holds no data file{skipped}", path.display()),
        ));
    }
    Ok(files)
}

/// The error for `path`, of type `t`, which is not what data is read from (`wanted`).
fn not_data(path: &Path, t: &std::fs::FileType, wanted: &str) -> std::io::Error {
    use std::os::unix::fs::FileTypeExt;
    let kind = if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "{}: {kind}, not {wanted}: data is read from files (a stream goes through --pipe-command)",
            path.display()
        ),
    )
}

/// Most files one command writes (`--parts`): far above any cluster's trainers, and a bound on
/// the files a typo can create.
pub const MAX_PARTS: usize = 1 << 16;

/// Checks that `lines` (named `what`) fill `parts` parts: an empty part would leave its trainer
/// without data.
pub fn check_fill(parts: usize, lines: u64, what: &str) -> Result<(), String> {
    if parts as u64 > lines {
        return Err(format!("--parts {parts} is more than the {lines} {what}: some parts would be empty"));
    }
    Ok(())
}

/// The lines of each of `parts` balanced parts of `lines` lines (the first `lines % parts`
/// one longer): never an empty part when `parts <= lines`.
pub fn part_sizes(lines: u64, parts: usize) -> impl Iterator<Item = u64> {
    let parts = parts.max(1) as u64;
    (0..parts).map(move |k| lines / parts + u64::from(k < lines % parts))
}

/// Checks that `dir` holds no part file (`PREFIX` then digits) numbered `parts` or more: one
/// from an earlier run with more parts was left beside the new ones, read as data with them
/// (`oar gen` run twice held 3,000 train lines where its `meta.json` said 1,000).
pub fn check_no_stale_parts(dir: &Path, prefix: &str, parts: usize) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    let mut stale: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| {
            let digits = name.strip_prefix(prefix).unwrap_or("");
            digits.len() >= 5
                && digits.bytes().all(|b| b.is_ascii_digit())
                && digits.parse::<u64>().is_ok_and(|k| k >= parts as u64)
        })
        .collect();
    stale.sort();
    match stale.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} holds {first} ({} part file(s) in all) from an earlier run with more parts: it would be read with \
             the new {parts}; remove them or write elsewhere",
            dir.display(),
            stale.len()
        )),
    }
}

/// Checks a `--parts` count: at least 1, at most [`MAX_PARTS`].
pub fn check_parts(parts: usize) -> Result<(), String> {
    match parts {
        0 => Err("--parts must be at least 1".into()),
        p if p > MAX_PARTS => Err(format!("--parts is {p}, more than the {MAX_PARTS} files oar writes at once")),
        _ => Ok(()),
    }
}

/// Opens `path` (a link followed) for reading if it is a regular file; a named pipe or a device
/// is refused naming what it is. Opened without blocking, then checked, so a pipe is never
/// waited on.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_data(path, &meta.file_type(), "a regular file"));
    }
    Ok(file)
}

/// Splits `path` by line into `parts` files `path-00000 ..`, balanced (sizes differ by at
/// most one line), keeping line order within and across parts. Returns the files and lines.
pub fn split_file(path: &Path, parts: usize) -> std::io::Result<(Vec<PathBuf>, u64)> {
    use std::io::Write;
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    check_parts(parts).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // Two passes over the file (count, then write), each a buffer at a time: memory stays flat
    // for files of any size, and for lines of any length.
    let meta = std::fs::metadata(path).map_err(named)?;
    if !meta.is_file() {
        // Opening a named pipe blocks until a writer comes; /dev/zero has no end to count.
        return Err(not_data(path, &meta.file_type(), "a regular file"));
    }
    let open = || std::fs::File::open(path).map(std::io::BufReader::new).map_err(named);
    let lines = copy_lines(&mut open()?, &mut std::io::sink(), u64::MAX).map_err(named)?;
    if (parts as u64) > lines {
        // An empty part would leave its trainer without data.
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: {lines} line(s) cannot fill {parts} parts", path.display()),
        ));
    }
    let (dir, name) = (path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")), path.file_name());
    let prefix = format!("{}-", name.map(|n| n.to_string_lossy()).unwrap_or_default());
    check_no_stale_parts(dir, &prefix, parts).map_err(|e| std::io::Error::new(std::io::ErrorKind::AlreadyExists, e))?;
    let mut reader = open()?;
    let mut files = Vec::with_capacity(parts);
    for (k, count) in (0..parts as u64).zip(part_sizes(lines, parts)) {
        let out = PathBuf::from(format!("{}-{k:05}", path.display()));
        // Written to a new file beside it, then renamed into place: a link already at the
        // part's name is replaced, never written through (`in-00000 -> in` emptied the input
        // being split, and a link to a file elsewhere overwrote that file).
        let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = out.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let named = |p: &Path| {
            let p = p.to_path_buf();
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
        };
        let written = (|| {
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(named(&tmp))?;
            let mut w = std::io::BufWriter::new(file);
            // A full disk was reported without the file it was writing.
            let copying = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("{} -> {}: {e}", path.display(), out.display()))
            };
            copy_lines(&mut reader, &mut w, count).map_err(copying)?;
            w.flush().map_err(named(&out))?;
            std::fs::rename(&tmp, &out).map_err(named(&out))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        files.push(out);
    }
    Ok((files, lines))
}

/// Moves up to `lines` lines from `r` to `w`, each ended by `\n` (a last line without one is
/// given it), a buffer at a time, so a line of any length costs no memory; returns the lines
/// moved (with `u64::MAX` and a sink: counts them).
fn copy_lines(r: &mut impl std::io::BufRead, w: &mut impl std::io::Write, lines: u64) -> std::io::Result<u64> {
    let (mut moved, mut open) = (0u64, false);
    while moved < lines {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            if open {
                w.write_all(b"\n")?;
                moved += 1;
            }
            break;
        }
        let mut end = buf.len();
        let mut ended = 0u64;
        for (i, &b) in buf.iter().enumerate() {
            if b == b'\n' {
                ended += 1;
                if moved + ended == lines {
                    end = i + 1;
                    break;
                }
            }
        }
        w.write_all(&buf[..end])?;
        open = buf[end - 1] != b'\n';
        r.consume(end);
        moved += ended;
    }
    Ok(moved)
}

/// Total size in bytes of `files` (unreadable files count 0): what progress bars measure.
pub fn total_bytes(files: &[PathBuf]) -> u64 {
    files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum()
}

fn numeric_suffix(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits: String = name.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    digits.chars().rev().collect::<String>().parse().ok()
}

/// The files trainer `id` of `trainers` reads: those whose numeric name suffix (as in
/// `part-00003`) satisfies `suffix % trainers == id`, or, when some file has no numeric suffix,
/// those whose position in name order does.
pub fn shard_files(files: &[PathBuf], trainers: usize, id: usize) -> Vec<PathBuf> {
    let suffixes: Option<Vec<u64>> = files.iter().map(|f| numeric_suffix(f)).collect();
    files
        .iter()
        .enumerate()
        .filter(|(i, f)| match &suffixes {
            Some(_) => numeric_suffix(f).expect("checked above") % trainers as u64 == id as u64,
            None => i % trainers == id,
        })
        .map(|(_, f)| f.clone())
        .collect()
}

/// The data files a `--train`/`--test` path names, as absolute paths.
pub fn resolve_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let files = list_files(path)?;
    Ok(files.into_iter().map(|f| std::path::absolute(&f).unwrap_or(f)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_balances_lines_and_a_pattern_lists_the_parts() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big.txt");
        std::fs::write(&f, "a\nb\nc\nd\ne").unwrap();
        let (parts, lines) = split_file(&f, 3).unwrap();
        assert_eq!(lines, 5);
        let texts: Vec<String> = parts.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect();
        assert_eq!(texts, ["a\nb\n", "c\nd\n", "e\n"]);
        assert_eq!(list_files(&dir.path().join("big.txt-*")).unwrap(), parts);
        assert_eq!(shard_files(&parts, 2, 1), [parts[1].clone()]);
        assert!(list_files(&dir.path().join("nothing-*")).unwrap_err().to_string().contains("no file matches"));
        // Links at the parts' names are replaced, not written through: one to the input
        // itself emptied it, one elsewhere overwrote that file.
        let outside = dir.path().join("victim");
        std::fs::write(&outside, "keep\n").unwrap();
        std::fs::remove_file(&parts[0]).unwrap();
        std::fs::remove_file(&parts[1]).unwrap();
        std::os::unix::fs::symlink(&f, &parts[0]).unwrap();
        std::os::unix::fs::symlink(&outside, &parts[1]).unwrap();
        split_file(&f, 3).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a\nb\nc\nd\ne");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep\n");
        assert!(!std::fs::symlink_metadata(&parts[0]).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&parts[1]).unwrap(), "c\nd\n");
    }

    #[test]
    fn parts_are_balanced_and_stale_parts_of_an_earlier_run_are_named() {
        assert_eq!(part_sizes(5, 4).collect::<Vec<_>>(), [2, 1, 1, 1]);
        assert_eq!(part_sizes(8, 4).collect::<Vec<_>>(), [2, 2, 2, 2]);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("in");
        std::fs::write(&f, "a\nb\nc\n").unwrap();
        split_file(&f, 3).unwrap();
        // A split into fewer parts would leave in-00002 beside the new ones.
        let err = split_file(&f, 2).unwrap_err().to_string();
        assert!(err.contains("holds in-00002 (1 part file(s) in all) from an earlier run"), "{err}");
        std::fs::remove_file(dir.path().join("in-00002")).unwrap();
        split_file(&f, 2).unwrap();
        // Other names are not parts.
        std::fs::write(dir.path().join("in-0000x"), "").unwrap();
        std::fs::write(dir.path().join("in-2"), "").unwrap();
        check_no_stale_parts(dir.path(), "in-", 2).unwrap();
    }

    #[test]
    fn lines_are_moved_a_buffer_at_a_time_whatever_their_length() {
        let count = |text: &[u8]| copy_lines(&mut std::io::Cursor::new(text), &mut std::io::sink(), u64::MAX).unwrap();
        assert_eq!([count(b""), count(b"a"), count(b"a\nb"), count(b"a\nb\n"), count(b"\n\n")], [0, 1, 2, 2, 2]);
        // A line far longer than the reader's buffer, then two more: moved whole, in order.
        let long = vec![b'x'; 100_000];
        let text = [long.clone(), b"\nsecond\nthird".to_vec()].concat();
        let mut r = std::io::BufReader::with_capacity(64, std::io::Cursor::new(text));
        let mut first = Vec::new();
        assert_eq!(copy_lines(&mut r, &mut first, 1).unwrap(), 1);
        assert_eq!(first, [long, b"\n".to_vec()].concat());
        let mut rest = Vec::new();
        assert_eq!(copy_lines(&mut r, &mut rest, 5).unwrap(), 2);
        assert_eq!(rest, b"second\nthird\n");
    }

    #[test]
    fn a_parts_count_is_bounded() {
        assert!(check_parts(1).is_ok() && check_parts(MAX_PARTS).is_ok());
        assert_eq!(check_parts(0).unwrap_err(), "--parts must be at least 1");
        assert!(check_parts(MAX_PARTS + 1).unwrap_err().contains("more than the 65536 files"));
    }

    #[test]
    fn files_are_dealt_by_suffix() {
        let files: Vec<PathBuf> =
            ["d/part-00000", "d/part-00001", "d/part-00002", "d/part-00003"].iter().map(PathBuf::from).collect();
        assert_eq!(shard_files(&files, 2, 1), vec![PathBuf::from("d/part-00001"), PathBuf::from("d/part-00003")]);
        let named: Vec<PathBuf> = ["a.txt", "b.txt", "c.txt"].iter().map(PathBuf::from).collect();
        assert_eq!(shard_files(&named, 2, 0), vec![PathBuf::from("a.txt"), PathBuf::from("c.txt")]);
    }

    #[test]
    fn links_in_a_data_folder_are_not_followed_and_an_empty_result_says_so() {
        let (data, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let real = elsewhere.path().join("day1.txt");
        std::fs::write(&real, "1\t2\n").unwrap();
        std::os::unix::fs::symlink(&real, data.path().join("part-00000")).unwrap();
        let err = list_files(data.path()).unwrap_err().to_string();
        assert!(err.contains("no data file") && err.contains("1 symbolic link(s) and 0 named pipe(s)"), "{err}");
        // A named pipe among the parts is named too, not skipped without a word.
        let fifo =
            std::ffi::CString::new(data.path().join("part-00002").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = list_files(data.path()).unwrap_err().to_string();
        assert!(err.contains("1 symbolic link(s) and 1 named pipe(s), device(s) or socket(s) skipped"), "{err}");
        std::fs::write(data.path().join("part-00001"), "1\t2\n").unwrap();
        assert_eq!(list_files(data.path()).unwrap(), [data.path().join("part-00001")]);
    }

    #[test]
    fn a_missing_path_is_named() {
        let err = list_files(Path::new("/nonexistent/oar")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/oar"), "{err}");
    }
}
