//! Test fixtures: generated data, in-process servers, trainer configs, checkpoint comparison.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use oar::protocol::{Mode, ServerStats};
use oar::server::ServerConfig;
use oar::table::Optimizer;
use oar::train::TrainConfig;

/// Where the real public data sets live, if this checkout has `../shared` beside it.
pub fn shared_data() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    p.is_dir().then_some(p)
}

/// Generated Criteo-format data: `parts` training files of `lines_per_part` lines each, and a
/// test file.
pub fn gen_data(dir: &Path, parts: usize, lines_per_part: u64, test_lines: u64) -> (PathBuf, PathBuf) {
    oar::data::gen::generate(&oar::data::gen::GenConfig {
        lines: parts as u64 * lines_per_part,
        test_lines,
        seed: 7,
        parts,
        out: dir.to_path_buf(),
    })
    .unwrap();
    (dir.join("train"), dir.join("test"))
}

/// A server running in-process on 127.0.0.1:0; joins with its final counters.
pub struct TestServer {
    pub addr: String,
    pub handle: JoinHandle<ServerStats>,
}

pub fn server_config(index: usize, num_servers: usize, trainers: usize, mode: Mode) -> ServerConfig {
    ServerConfig {
        index,
        metrics_addr: None,
        num_servers,
        trainers,
        mode,
        job: "test".into(),
        max_frame: oar::protocol::DEFAULT_MAX_FRAME,
        timeout: Duration::from_secs(60),
        lag_ratio: 1.5,
        resume: None,
        exit_when_done: true,
        sparse_ports: 0,
        save_dir: None,
        // Tests save into temporary folders.
        save_root: std::env::temp_dir(),
        checkpoints: None,
        epoch: 0,
        closed: Vec::new(),
        rejoin: None,
        limits: oar::server::Limits::default(),
        secret: None,
        tls: None,
    }
}

/// Starts a server and returns once it is listening (the bound address is the signal).
pub fn start_server(config: ServerConfig) -> TestServer {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            oar::server::run(vec![listener], config, std::future::pending()).await.unwrap()
        })
    });
    let addr = rx.recv().expect("the server thread reports its address");
    TestServer { addr, handle }
}

/// Starts `n` servers for one job.
pub fn start_cluster(n: usize, trainers: usize, mode: Mode, resume: Option<&Path>) -> Vec<TestServer> {
    (0..n)
        .map(|i| {
            start_server(ServerConfig { resume: resume.map(Path::to_path_buf), ..server_config(i, n, trainers, mode) })
        })
        .collect()
}

/// A small model and a trainer config for tests.
pub fn train_config(
    mode: Mode,
    servers: &[TestServer],
    trainer_id: usize,
    trainers: usize,
    train: &Path,
) -> TrainConfig {
    TrainConfig {
        secret: None,
        tls: None,
        mode,
        servers: servers.iter().map(|s| s.addr.clone()).collect(),
        ports_num: 1,
        ports_num_for_sparse: 0,
        trainer_id,
        trainers,
        train_files: oar::data::resolve_files(train).unwrap(),
        test_files: Vec::new(),
        batch_size: 32,
        passes: 1,
        threads: 1,
        model: oar::model::ModelConfig { hidden: Some(vec![64, 32]), block_size: 1000, ..Default::default() },
        data: Default::default(),
        dense_optimizer: Optimizer::adam(1e-3),
        // A positive initial accumulator (TensorFlow's default 0.1) keeps Adagrad's first step
        // lr * g / sqrt(g^2) from amplifying the rounding of near-zero gradients, so results
        // that differ only in float summation order stay within 1e-5 of each other.
        sparse_optimizer: Optimizer { initial_accumulator: 0.1, ..Optimizer::adagrad(0.05) },
        output: None,
        resume: None,
        init_model: None,
        log_every: 0,
        metrics_addr: None,
        metrics_csv: None,
        metrics_every: 0,
        tensorboard: None,
        job: "test".into(),
        skip_bad_lines: false,
        nonfinite: Default::default(),
        recover: None,
        positions: None,
        rejoin: false,
        connect_timeout: Duration::from_secs(10),
        reply_timeout: Duration::from_secs(90),
        delay: 0,
        // The default: tests that want the pipeline that pulls ahead set it.
        pull_ahead: false,
        shuffle: None,
        sync_warmup: oar::train::job_config::DEFAULT_SYNC_WARMUP,
        scale_stale_steps: oar::train::job_config::DEFAULT_SCALE_STALE_STEPS,
        sync_dense: false,
        sync_dense_parts: 1,
        sync_dense_ramp: oar::train::job_config::DEFAULT_SYNC_DENSE_RAMP,
        geo_k_steps: oar::train::job_config::DEFAULT_GEO_K_STEPS,
        clip_grad_norm: None,
        precision: Default::default(),
        delta_every: None,
        online: None,
    }
}

/// Runs one trainer thread per config and waits for all of them.
/// Starts `servers` servers for `trainers` trainers in `mode`, trains every trainer with
/// `config(cluster, trainer)` and returns their reports once the servers have stopped.
pub fn train_on_cluster(
    servers: usize,
    trainers: usize,
    mode: Mode,
    config: impl Fn(&[TestServer], usize) -> TrainConfig,
) -> Vec<oar::train::TrainReport> {
    let cluster = start_cluster(servers, trainers, mode, None);
    let reports = run_trainers((0..trainers).map(|t| config(&cluster, t)).collect());
    for s in cluster {
        s.handle.join().unwrap();
    }
    reports
}

pub fn run_trainers(configs: Vec<TrainConfig>) -> Vec<oar::train::TrainReport> {
    let handles: Vec<_> =
        configs.into_iter().map(|c| std::thread::spawn(move || oar::train::run(&c, &|_, _| {}).unwrap())).collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A saved model's parameters: the flat dense vector and every table's rows, sorted by id.
pub struct Params {
    pub dense: Vec<f32>,
    pub rows: Vec<(usize, u64, Vec<f32>)>,
}

pub fn load_params(dir: &Path) -> Params {
    let (_, shard) = oar::persist::checkpoint::load_merged(dir).unwrap();
    let mut dense = Vec::new();
    shard.dense.lock().read(&mut dense);
    let mut rows = Vec::new();
    for (t, table) in shard.sparse.iter().enumerate() {
        let dim = table.spec().dim;
        table.for_each_row(|id, row| rows.push((t, id, row[..dim].to_vec())));
    }
    rows.sort_by_key(|r| (r.0, r.1));
    Params { dense, rows }
}

/// Asserts two models are equal within relative tolerance `rel` (0 = bit for bit), relative to
/// each value or, for values far below their tensor's scale, to the tensor's RMS: near zero the
/// order of float summation alone moves a value by 1e-6 of a step, which is a large relative
/// difference of a tiny number.
pub fn assert_same_params(a: &Params, b: &Params, rel: f32) {
    let rms = |v: &mut dyn Iterator<Item = f32>| {
        let (s, n) = v.fold((0.0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
        (s / n.max(1) as f64).sqrt() as f32
    };
    let dense_scale = rms(&mut a.dense.iter().copied());
    let row_scale = rms(&mut a.rows.iter().flat_map(|r| r.2.iter().copied()));
    let close = |x: f32, y: f32, scale: f32| (x - y).abs() <= rel * x.abs().max(y.abs()).max(scale);
    assert_eq!(a.dense.len(), b.dense.len());
    let differ: Vec<(f32, f32)> =
        a.dense.iter().zip(&b.dense).filter(|(x, y)| !close(**x, **y, dense_scale)).map(|(x, y)| (*x, *y)).collect();
    assert!(
        differ.is_empty(),
        "{} of {} dense values differ: {:?}",
        differ.len(),
        a.dense.len(),
        &differ[..differ.len().min(8)]
    );
    assert_eq!(a.rows.len(), b.rows.len(), "different numbers of embedding rows");
    for ((ta, ia, ra), (tb, ib, rb)) in a.rows.iter().zip(&b.rows) {
        assert_eq!((ta, ia), (tb, ib));
        for (x, y) in ra.iter().zip(rb) {
            assert!(close(*x, *y, row_scale), "table {ta} row {ia}: {ra:?} vs {rb:?}");
        }
    }
}

/// A base of `n` consecutive ports free on 127.0.0.1 (checked by binding them), taken below
/// Linux's ephemeral range (32768 and up) so that listeners bound to port 0 by tests running
/// at the same time can never take them, and a fresh block per call.
pub fn free_ports(n: usize) -> u16 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let (low, span) = (20_000usize, 12_000usize);
    let start = std::process::id() as usize * 97 % span;
    for _ in 0..500 {
        let base = low + (start + NEXT.fetch_add(n, Ordering::SeqCst)) % (span - n);
        let held: Vec<_> =
            (0..n).map_while(|k| std::net::TcpListener::bind(("127.0.0.1", (base + k) as u16)).ok()).collect();
        if held.len() == n {
            return base as u16;
        }
    }
    panic!("no {n} consecutive free ports between {low} and {}", low + span);
}

/// Processes whose command line or environment mentions `needle` (our children carry the
/// test's temporary paths in their arguments, remote ones their job id in their environment).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let read = |f: &str| std::fs::read(entry.path().join(f)).map(|b| String::from_utf8_lossy(&b).into_owned());
        if read("cmdline").is_ok_and(|c| c.contains(needle)) || read("environ").is_ok_and(|e| e.contains(needle)) {
            found.push(pid);
        }
    }
    found
}

/// Daemons a test started, killed and reaped by PID when the guard drops (test passed or not).
#[derive(Default)]
pub struct Daemons(pub Vec<(String, std::process::Child)>);

impl Daemons {
    /// Starts `cmd` with its output in `log`.
    pub fn start(&mut self, name: &str, cmd: &mut std::process::Command, log: &Path) -> std::io::Result<()> {
        let out = std::fs::File::create(log)?;
        let child = cmd.stdout(out.try_clone()?).stderr(out).stdin(std::process::Stdio::null()).spawn()?;
        self.0.push((name.to_string(), child));
        Ok(())
    }

    /// Panics naming a daemon that has exited (its log says why).
    pub fn check_running(&mut self) {
        for (name, child) in &mut self.0 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{name} exited early with {status}");
            }
        }
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        // SIGTERM first so daemons stop their own helpers (slurmctld's slurmscriptd), then SIGKILL
        // whatever is still there after a few seconds.
        for (_, child) in &mut self.0 {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for (_, child) in self.0.iter_mut().rev() {
            while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until `ready` holds, at most `secs` seconds, failing with `what`.
pub fn wait_until(secs: u64, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !ready() {
        assert!(std::time::Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Python that imports `modules` (`OAR_PYTHON`, else `python3`), if there is one; says it
/// skips, naming them, when there is none.
pub fn python_with(modules: &str) -> Option<String> {
    let py = std::env::var("OAR_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: no Python with {modules} ({py}; .ci/run installs them)");
    }
    ok.then_some(py)
}

/// Whether `program` can be run (found on PATH or at that path).
pub fn installed(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A model built for Criteo-format data with the built-in layer types.
pub fn criteo_model(config: &oar::model::ModelConfig) -> oar::model::Model {
    oar::train::job_config::build_model(config, &oar::data::DataConfig::default(), &oar::model::Registry::default())
        .unwrap()
        .0
}

/// The zoo's Criteo models (`examples/zoo/NAME.toml`).
pub const ZOO: [&str; 11] =
    ["lr", "fm", "wide_deep", "deepfm", "dcn", "dcn_v2", "dlrm", "ffm", "xdeepfm", "autoint", "gatenet"];

/// GateNet's job file with the bit-wise gate and a layer norm after the first hidden layer
/// (what the shipped file measured against), written into `dir`: runs the two layers the zoo
/// does not ship.
pub fn gatenet_variant(dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(zoo_job("gatenet")).unwrap();
    let variant = shipped.replace("mode = \"vector\"", "mode = \"bit\"").replace(
        "{ name = \"logit\", type = \"mlp\", input = \"x\", hidden = [400, 400, 400], out = 1 },",
        "{ name = \"h1\", type = \"mlp\", input = \"x\", hidden = [400] },\n  \
         { name = \"h1n\", type = \"layer_norm\", input = \"h1\" },\n  \
         { name = \"logit\", type = \"mlp\", input = \"h1n\", hidden = [400, 400], out = 1 },",
    );
    assert!(variant.contains("layer_norm") && variant.contains("\"bit\""), "the variant's edits apply");
    let path = dir.join("gatenet_bit_ln.toml");
    std::fs::write(&path, variant).unwrap();
    path
}

/// DIN's job file with Dice in the attention unit instead of PReLU, written into `dir`.
pub fn din_dice_variant(dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(zoo_job("din")).unwrap();
    let variant = shipped.replace("hidden = [80, 40] }", "hidden = [80, 40], activation = \"dice\" }");
    assert!(variant.contains("\"dice\""), "the variant's edit applies");
    let path = dir.join("din_dice.toml");
    std::fs::write(&path, variant).unwrap();
    path
}

/// The job file of zoo model `name` (`examples/zoo/NAME.toml`).
pub fn zoo_job(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/zoo").join(format!("{name}.toml"))
}

/// Runs the `oar` binary to its end (not as a launched child).
pub fn oar(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(args)
        .env_remove("OAR_LAUNCHED")
        .output()
        .expect("oar runs")
}

/// Starts the `oar` binary (not as a launched child) with `args` and `OAR_FAULT=fault`, its
/// output in `dir/log`.
pub fn spawn_oar<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S], fault: &str, log: &str) -> std::process::Child {
    let file = std::fs::File::create(dir.join(log)).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(args)
        .env("OAR_FAULT", fault)
        .env_remove("OAR_LAUNCHED")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// A process's stdout and stderr, as text.
pub fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The number after the last `key` in `haystack`.
pub fn number_after(haystack: &str, key: &str) -> f64 {
    let at = haystack.rfind(key).unwrap_or_else(|| panic!("'{key}' not in output:\n{haystack}")) + key.len();
    haystack[at..].split_whitespace().next().unwrap().trim_end_matches(',').parse().unwrap()
}

/// A trainer config for job file `job`'s model, data, optimizers, batch size and passes.
pub fn job_config(
    job: &Path,
    mode: Mode,
    servers: &[TestServer],
    id: usize,
    trainers: usize,
    train: &Path,
) -> TrainConfig {
    let job = oar::train::job_config::JobConfig::from_file(job).unwrap();
    let mut c = train_config(mode, servers, id, trainers, train);
    c.model = job.model;
    c.data = job.data;
    c.dense_optimizer = job.dense_optimizer;
    c.sparse_optimizer = job.sparse_optimizer;
    c.batch_size = job.train.batch_size;
    c.passes = job.train.passes;
    c.pull_ahead = job.train.pull_ahead;
    c
}

/// Runs `oar launch` with `args` (2 x 2 unless they say otherwise), its logs in `logs`,
/// asserting it succeeded; returns its output text and `summary.json`.
pub fn launch(logs: &Path, args: &[&str]) -> (String, oar::run::launch::LaunchSummary) {
    let logs_arg = logs.display().to_string();
    let all: Vec<&str> = ["launch", "--logs", &logs_arg, "--no-progress"].iter().chain(args).copied().collect();
    let out = oar(&all);
    assert!(out.status.success(), "{}", text(&out));
    let summary = std::fs::read_to_string(logs.join("summary.json")).unwrap();
    (text(&out), serde_json::from_str(&summary).unwrap())
}

/// Runs `oar launch` (2 x 2) of the zoo's job file `job` on `data/train`, tested on
/// `data/test`, with `extra` flags, its logs in `data/logs-JOB`; as [`launch`].
pub fn launch_zoo(data: &Path, job: &str, extra: &[&str]) -> (String, oar::run::launch::LaunchSummary) {
    let (job_file, train, test) = (zoo_job(job), data.join("train"), data.join("test"));
    let mut args = vec![
        "--config",
        job_file.to_str().unwrap(),
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
    ];
    args.extend(extra);
    launch(&data.join(format!("logs-{job}")), &args)
}

/// The first 8,000 census lines as two training parts, the last 2,000 as the test set (raw
/// UCI lines, uncompressed).
pub fn census_split(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let gz = std::fs::File::open(shared_data()?.join("multitask/census-income.test.first10k.txt.gz")).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 10_000);
    let (train, test) = (dir.join("train"), dir.join("test"));
    std::fs::create_dir_all(&train).unwrap();
    std::fs::create_dir_all(&test).unwrap();
    for (k, part) in lines[..8000].chunks(4000).enumerate() {
        let mut f = std::fs::File::create(train.join(format!("part-{k:05}"))).unwrap();
        part.iter().for_each(|l| std::io::Write::write_all(&mut f, format!("{l}\n").as_bytes()).unwrap());
    }
    std::fs::write(test.join("part-00000"), lines[8000..].join("\n") + "\n").unwrap();
    Some((train, test))
}

/// A TCP connection from loopback address `source` (any port) to `addr`.
pub fn connect_from(source: &str, addr: &str) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&format!("{source}:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    socket.connect(&addr.parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    socket.into()
}

/// A raw HTTP/1.1 request from a socket bound to `source` (another loopback address), read to
/// its close: (status line, body).
pub fn request_from(source: &str, addr: &str, request: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = connect_from(source, addr);
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answered and closed within 60 s");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

/// Starts `oar pserver --host 127.0.0.1 --port 0` with `args` (its standard error to
/// `stderr`); returns it with the address it listens on.
pub fn pserver_ready(args: &[&str], stderr: std::process::Stdio) -> (std::process::Child, String) {
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
    server_ready(server.args(["pserver", "--host", "127.0.0.1", "--port", "0"]).args(args).stderr(stderr))
}

/// Starts the server `command` runs, reads its standard output up to its `OAR_READY` line, and
/// returns it with the address it listens on.
pub fn server_ready(command: &mut std::process::Command) -> (std::process::Child, String) {
    let mut server = command.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.as_mut().unwrap()), &mut line).unwrap();
    let addr = line.trim().strip_prefix("OAR_READY ").unwrap_or_else(|| panic!("no OAR_READY line: {line:?}"));
    (server, addr.to_string())
}

/// A relay on the path between trainers and a server, keeping a copy of every byte that
/// crosses it either way. A resetting relay first resets connections it accepts (as a process
/// stopping behind the address, or a Kubernetes service routing to a pod going away, does).
pub struct Relay {
    /// Where trainers connect to reach the server through the relay.
    pub addr: String,
    /// Every byte carried, both ways, in the order read.
    pub seen: Arc<Mutex<Vec<u8>>>,
    /// Connections reset so far.
    pub resets: Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    /// A relay that carries every connection.
    pub fn new(to: String) -> Relay {
        Relay::resetting(to, 0)
    }

    /// A relay that resets the first `first` connections it accepts (all: `usize::MAX`), each
    /// once the peer has sent its first bytes, then carries the rest.
    pub fn resetting(to: String, first: usize) -> Relay {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (seen, resets) = (Arc::new(Mutex::new(Vec::new())), Arc::new(std::sync::atomic::AtomicUsize::new(0)));
        let (log, reset) = (seen.clone(), resets.clone());
        std::thread::spawn(move || {
            for from in listener.incoming().flatten() {
                if reset.load(SeqCst) < first {
                    // Reset once the peer has spoken (within a second), so its connect has
                    // completed and the reset cuts its handshake, not its connect.
                    let mut first_bytes = [0u8; 64];
                    let _ = from.set_read_timeout(Some(Duration::from_secs(1)));
                    let _ = (&from).read(&mut first_bytes);
                    // Closed with no lingering: the peer gets a reset, not an end.
                    socket2::SockRef::from(&from).set_linger(Some(Duration::ZERO)).unwrap();
                    // Counted first: the peer sees no reset the count does not hold.
                    reset.fetch_add(1, SeqCst);
                    drop(from);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&to) else { continue };
                for (mut a, mut b) in [(from.try_clone().unwrap(), server.try_clone().unwrap()), (server, from)] {
                    let log = log.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 1 << 16];
                        while let Ok(n @ 1..) = a.read(&mut buf) {
                            log.lock().unwrap().extend_from_slice(&buf[..n]);
                            if b.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = b.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Relay { addr, seen, resets }
    }

    /// Whether `needle` is among the bytes carried (both ways, interleaved as read).
    pub fn saw(&self, needle: &[u8]) -> bool {
        self.seen.lock().unwrap().windows(needle.len()).any(|w| w == needle)
    }
}

/// Trainer `trainer`'s push of one sample at step 0 of pass 1 with the dense part `dense` and
/// no rows: what the hostile-frame tests send whole or cut short.
pub fn dense_push(trainer: u64, dense: &[f32]) -> oar::protocol::Push<'_> {
    oar::protocol::Push {
        trainer,
        step: 0,
        pass: 1,
        base_version: 0,
        samples: 1,
        part: oar::protocol::PushPart::Whole,
        apply: oar::protocol::Apply::Now,
        dense: vec![dense.into()],
        sparse: Vec::new(),
    }
}
