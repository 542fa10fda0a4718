//! `oar bench --security`: what authentication and TLS cost, side by side in one run. Four
//! guards, measured in turn round after round so the machine's drift hits each alike: open
//! (no secret, plain TCP), one shared secret (every process proves the job's master at each
//! connection), per-process credentials (each proves its own identity, the server derives its
//! key), and credentials with TLS. Per guard: connections set up per second (TCP, TLS and the secret's
//! handshake, `Hello`), dense push+pull GB/s through one server, and the CTR-DNN's samples/s
//! on 2 servers x 2 workers launched as processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{connect_with, dense_round, median, rate, ServerProc};
use crate::client::{Client, ClientConfig};
use crate::protocol::Mode;
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, TableSpec};

/// What to run.
pub struct SecurityConfig {
    /// A folder with `train/` and `test/` for the launched runs; `None`: those are skipped.
    pub data: Option<PathBuf>,
    /// Rounds (each measures every guard once); medians are reported.
    pub rounds: usize,
    /// Seconds per guard and figure in each round.
    pub seconds: f64,
    /// Dense floats per push and per pull.
    pub dense_floats: usize,
    /// The `oar` binary.
    pub exe: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Guard {
    Open,
    Shared,
    Credential,
    CredentialTls,
}

impl Guard {
    const ALL: [Guard; 4] = [Guard::Open, Guard::Shared, Guard::Credential, Guard::CredentialTls];

    fn name(self) -> &'static str {
        match self {
            Guard::Open => "open (no secret, TCP)",
            Guard::Shared => "shared secret (HMAC, TCP)",
            Guard::Credential => "per-process credentials",
            Guard::CredentialTls => "credentials + TLS",
        }
    }
}

/// A server behind one guard, and a client configuration that passes it.
struct Guarded {
    server: ServerProc,
    client: ClientConfig,
}

fn start(exe: &Path, dir: &Path, guard: Guard) -> anyhow::Result<Guarded> {
    let (mut args, mut client) =
        (Vec::new(), ClientConfig::new(vec![], "bench", Duration::from_secs(10), Duration::from_secs(60)));
    if guard != Guard::Open {
        let file = dir.join(format!("secret-{guard:?}"));
        let secret = crate::security::auth::Secret::generate();
        secret.write_new(&file)?;
        args.extend(["--secret-file".to_string(), file.display().to_string()]);
        // The bench's client acts as trainer 0 (it pushes): with credentials, it holds that one.
        let own = secret.derive("bench", crate::security::auth::Identity::Trainer(0))?;
        client.secret = Some(if guard == Guard::Shared { secret } else { own });
        client.trainer = Some(0);
    }
    if guard == Guard::CredentialTls {
        let files = crate::security::tls::generate(&dir.join("tls"), crate::security::tls::DEFAULT_NAME)?;
        for (flag, path) in [("--tls-cert", &files.cert), ("--tls-key", &files.key)] {
            args.extend([flag.to_string(), path.display().to_string()]);
        }
        client.tls = Some(crate::security::tls::client_config(&files.ca, crate::security::tls::DEFAULT_NAME)?);
    }
    let server = ServerProc::start_with(exe, &args)?;
    client.servers = vec![server.addr.clone()];
    Ok(Guarded { server, client })
}

/// Runs the measurements and prints them.
pub fn run(config: &SecurityConfig) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("oar-bench-security-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let result = measure(config, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(config: &SecurityConfig, dir: &Path) -> anyhow::Result<()> {
    let spec = TableSpec {
        dense: DenseSpec {
            params: vec![DenseParam::new("w", config.dense_floats, Init::Zeros)],
            block_size: 1 << 16,
            seed: 1,
            optimizer: Optimizer::sgd(1e-6),
        },
        sparse: vec![],
    };
    let guarded: Vec<Guarded> = Guard::ALL.iter().map(|g| start(&config.exe, dir, *g)).collect::<Result<_, _>>()?;
    let mut clients: Vec<Client> =
        guarded.iter().map(|g| connect_with(g.client.clone(), &spec)).collect::<Result<_, _>>()?;
    let grads = vec![1.0f32; config.dense_floats];
    let (mut dense, mut step) = (Vec::new(), 0u64);
    let mut handshakes: [Vec<f64>; 4] = Default::default();
    let mut gbps: [Vec<f64>; 4] = Default::default();
    let per_round = (2 * config.dense_floats * 4) as f64 / 1e9;
    for _ in 0..config.rounds.max(1) {
        for (k, g) in guarded.iter().enumerate() {
            // A trainer's connection: TCP (and TLS), the challenge and response, Hello.
            handshakes[k].push(rate(config.seconds, || {
                Client::connect(&g.client)?;
                Ok(())
            })?);
            let c = &mut clients[k];
            gbps[k].push(per_round * rate(config.seconds, || dense_round(c, &grads, &mut dense, &mut step))?);
        }
    }
    for (c, g) in clients.iter_mut().zip(guarded) {
        c.close(0)?;
        g.server.stop();
    }
    let rounds = config.rounds.max(1);
    println!(
        "security: {rounds} alternating rounds, medians; dense push+pull of {:.1} MiB each way through one server",
        (config.dense_floats * 4) as f64 / (1 << 20) as f64
    );
    let (h0, d0) = (median(handshakes[0].clone()), median(gbps[0].clone()));
    for (k, guard) in Guard::ALL.iter().enumerate() {
        let (h, d) = (median(handshakes[k].clone()), median(gbps[k].clone()));
        println!(
            "    {:30} {h:8.0} connections/s ({:.2}x open)   {d:6.2} GB/s dense ({:.2}x open)",
            guard.name(),
            h / h0,
            d / d0
        );
    }
    let Some(data) = &config.data else { return Ok(()) };
    println!("    CTR-DNN, 1 pass over {}, 2 servers x 2 workers async, end to end:", data.display());
    let mut samples: [Vec<f64>; 4] = Default::default();
    let mut aucs: [Vec<f64>; 4] = Default::default();
    for _ in 0..rounds {
        for (k, guard) in Guard::ALL.iter().enumerate() {
            let started = Instant::now();
            let s = launched(config, data, &dir.join("logs"), *guard)?;
            tracing::info!(guard = guard.name(), seconds = started.elapsed().as_secs_f64(), "launched run done");
            samples[k].push(s.samples_per_sec);
            aucs[k].push(s.test.as_ref().and_then(|t| t.auc).unwrap_or(f64::NAN));
        }
    }
    let base = median(samples[0].clone());
    for (k, guard) in Guard::ALL.iter().enumerate() {
        let each: Vec<String> = samples[k].iter().map(|s| format!("{s:.0}")).collect();
        println!(
            "    {:30} {:8.0} samples/s ({:.3}x open; runs {})   test AUC {:.4}",
            guard.name(),
            median(samples[k].clone()),
            median(samples[k].clone()) / base,
            each.join(", "),
            median(aucs[k].clone())
        );
    }
    Ok(())
}

fn launched(
    config: &SecurityConfig,
    data: &Path,
    logs: &Path,
    guard: Guard,
) -> anyhow::Result<crate::run::launch::LaunchSummary> {
    let _ = std::fs::remove_dir_all(logs);
    crate::run::launch::run(&crate::run::launch::LaunchConfig {
        tls: guard == Guard::CredentialTls,
        open: guard == Guard::Open,
        shared_secret: guard == Guard::Shared,
        ..super::two_by_two(Mode::Async, data, &config.exe, logs)
    })
}
