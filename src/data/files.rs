//! Which files a path names and which of them a trainer reads.

use std::path::{Path, PathBuf};

/// The data files named by `path`: the file itself, or the regular files of a folder in name
/// order (hidden files and `.json` metadata skipped).
pub fn list_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let meta =
        std::fs::metadata(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.ends_with(".json") || !entry.file_type()?.is_file() {
            continue;
        }
        files.push(entry.path());
    }
    files.sort();
    if files.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: folder holds no data file", path.display()),
        ));
    }
    Ok(files)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_dealt_by_suffix() {
        let files: Vec<PathBuf> =
            ["d/part-00000", "d/part-00001", "d/part-00002", "d/part-00003"].iter().map(PathBuf::from).collect();
        assert_eq!(shard_files(&files, 2, 1), vec![PathBuf::from("d/part-00001"), PathBuf::from("d/part-00003")]);
        let named: Vec<PathBuf> = ["a.txt", "b.txt", "c.txt"].iter().map(PathBuf::from).collect();
        assert_eq!(shard_files(&named, 2, 0), vec![PathBuf::from("a.txt"), PathBuf::from("c.txt")]);
    }

    #[test]
    fn a_missing_path_is_named() {
        let err = list_files(Path::new("/nonexistent/oar")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/oar"), "{err}");
    }
}
