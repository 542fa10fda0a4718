//! `oar data get` against a local HTTP server on loopback that serves files from
//! `../shared/data/` (skipped with a note when that folder is absent).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::util::shared_data;

/// Serves the files under `root` over HTTP/1.1 on 127.0.0.1 (404 for anything else) on a
/// background thread; returns the base URL and a request counter.
fn serve(root: PathBuf) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // Skip the headers.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
            let file = root.join(&path);
            let _ = match (path.contains(".."), std::fs::read(&file)) {
                (false, Ok(body)) => stream
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
                            .as_bytes(),
                    )
                    .and_then(|_| stream.write_all(&body)),
                _ => stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            };
        }
    });
    (url, requests)
}

fn oar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oar")).args(args).output().expect("oar runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn get(name: &str, cache: &Path, mirror: &str) -> Output {
    oar(&["data", "get", name, "--cache", cache.to_str().unwrap(), "--mirror", mirror])
}

#[test]
fn data_get_downloads_verifies_caches_and_rejects_a_tampered_file() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data is absent, nothing to serve");
        return;
    };
    let (mirror, requests) = serve(shared.clone());
    let cache = tempfile::tempdir().unwrap();

    // ptb.train.txt exists on this mirror only gzipped: it is fetched as .gz and unpacked.
    for name in ["uci_housing", "ptb"] {
        let out = get(name, cache.path(), &mirror);
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("downloaded, 0 already cached, checksums verified"), "{}", text(&out));
    }
    assert_eq!(
        std::fs::read(cache.path().join("uci_housing/housing.data")).unwrap(),
        std::fs::read(shared.join("uci_housing/housing.data")).unwrap()
    );
    assert_eq!(std::fs::metadata(cache.path().join("ptb/ptb.train.txt")).unwrap().len(), 5_101_618);

    // A second get finds everything cached and asks the server nothing.
    let before = requests.load(Ordering::SeqCst);
    let out = get("ptb", cache.path(), &mirror);
    assert!(text(&out).contains("0 file(s) downloaded, 3 already cached"), "{}", text(&out));
    assert_eq!(requests.load(Ordering::SeqCst), before);

    // A named pipe in the cache is not a cached file (it was hashed, so waited on for ever),
    // and a link planted at the download's temporary name is removed, not written through.
    let cached = cache.path().join("uci_housing/housing.data");
    std::fs::remove_file(&cached).unwrap();
    mkfifo(&cached);
    let outside = cache.path().join("outside.txt");
    std::fs::write(&outside, "not yours").unwrap();
    std::os::unix::fs::symlink(&outside, cached.with_extension("part")).unwrap();
    let out =
        bounded(&["data", "get", "uci_housing", "--cache", &cache.path().display().to_string(), "--mirror", &mirror]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read(&cached).unwrap(), std::fs::read(shared.join("uci_housing/housing.data")).unwrap());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "not yours");

    // A mirror serving a changed file: the checksum error names the URL; nothing is kept.
    let bad_root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(bad_root.path().join("uci_housing")).unwrap();
    let mut tampered = std::fs::read(shared.join("uci_housing/housing.data")).unwrap();
    tampered[10] ^= 1;
    std::fs::write(bad_root.path().join("uci_housing/housing.data"), tampered).unwrap();
    let (bad_mirror, _) = serve(bad_root.path().to_path_buf());
    let fresh = tempfile::tempdir().unwrap();
    let out = get("uci_housing", fresh.path(), &bad_mirror);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("checksum mismatch") && text(&out).contains(&bad_mirror), "{}", text(&out));
    let left: Vec<_> = std::fs::read_dir(fresh.path().join("uci_housing")).unwrap().collect();
    assert!(left.is_empty(), "a rejected download leaves no file");

    let out = get("criteo", fresh.path(), &mirror);
    assert!(text(&out).contains("forbid redistributing"), "{}", text(&out));
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// `oar ARGS` ended by `timeout` after 60 s: a regression that waits for ever fails the test
/// (exit 124) instead of hanging it.
fn bounded(args: &[&str]) -> Output {
    Command::new("timeout").arg("60").arg(env!("CARGO_BIN_EXE_oar")).args(args).output().expect("timeout runs")
}

/// `oar data prepare` reads only regular files, of at most 256 MiB: a named pipe was waited on
/// for ever, and /dev/zero (or any file without line ends) grew memory without end.
#[test]
fn data_prepare_refuses_a_pipe_a_device_and_an_endless_file() {
    let dir = tempfile::tempdir().unwrap();
    let (fifo, endless) = (dir.path().join("housing.fifo"), dir.path().join("housing.big"));
    mkfifo(&fifo);
    // Sparse: 300 MiB of zero bytes without a line end, no disk space taken.
    std::fs::File::create(&endless).unwrap().set_len(300 << 20).unwrap();
    let out = dir.path().join("out").display().to_string();
    for (src, says) in [
        (fifo.display().to_string(), "a named pipe"),
        ("/dev/zero".to_string(), "a character device"),
        (endless.display().to_string(), "more than 256 MiB"),
    ] {
        let o = bounded(&["data", "prepare", "uci-housing", "--src", &src, "--out", &out]);
        assert!(!o.status.success() && o.status.code() != Some(124) && text(&o).contains(says), "{src}: {}", text(&o));
    }
}

/// A mirror that answers as `respond` says, one connection at a time, after reading the
/// request's head; returns its URL.
fn hostile(respond: fn(&mut std::net::TcpStream)) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            std::thread::spawn(move || respond(&mut stream));
        }
    });
    url
}

/// Holds the connection open, sending nothing more, until the client hangs up.
fn hold(stream: &mut std::net::TcpStream) {
    let _ = std::io::Read::read(stream, &mut [0u8; 1]);
}

/// A host that goes silent (before its headers, or mid-file) fails the download after
/// `--read-timeout`, naming it; one that sends past the file's size, or too slowly, is stopped;
/// none leaves a file in the cache.
#[test]
fn data_get_names_a_silent_or_endless_host_and_keeps_nothing() {
    let cache = tempfile::tempdir().unwrap();
    let run = |mirror: &str| {
        let out = oar(&[
            "data",
            "get",
            "uci_housing",
            "--cache",
            cache.path().to_str().unwrap(),
            "--mirror",
            mirror,
            "--read-timeout",
            "1",
        ]);
        assert!(!out.status.success(), "{}", text(&out));
        text(&out)
    };
    let silent = hostile(hold);
    let err = run(&silent);
    assert!(err.contains("cannot download housing.data") && err.contains("timed out"), "{err}");

    let stalled = hostile(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0.00632  18.00");
        hold(s);
    });
    let err = run(&stalled);
    assert!(err.contains("/uci_housing/housing.data: the host sent nothing for 1 s"), "{err}");

    let endless = hostile(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        let chunk = vec![b'7'; 1 << 16];
        while s.write_all(&chunk).is_ok() {}
    });
    let err = run(&endless);
    assert!(err.contains("more than the 49082 bytes housing.data holds"), "{err}");
    // A host that sends a byte every 0.3 s is never silent for --read-timeout: it is stopped
    // once the download has run 30 s slower than 16 KiB/s.
    let trickle = hostile(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 49082\r\n\r\n");
        while s.write_all(b"7").is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    });
    let err = run(&trickle);
    assert!(err.contains("slower than 16 KiB/s: stopped"), "{err}");
    let left: Vec<_> = std::fs::read_dir(cache.path().join("uci_housing")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
