//! Peers that hold the job's secret (a leaked trainer credential, a buggy tool): what they
//! declare about their own requests is bounded before it touches any state. Each attack runs
//! against a real 2 x 2 sync job while its trainer 0 is stopped mid-pass; every attempt is
//! refused with a clear error, and the job's model is the undisturbed run's bit for bit.

use std::time::Duration;

use crate::security::{GuardedJob, JOB};
use crate::util::*;
use oar::client::{Client, ClientConfig, ClientError, StepHeader};
use oar::protocol::ServerStats;
use oar::security::auth::Secret;

/// Connects to `addrs` with the job's secret as trainer 0 (the real one is stopped, its
/// connections open).
fn insider(addrs: &[String], secret: &Secret) -> Client {
    let config = ClientConfig {
        secret: Some(secret.clone()),
        trainer: Some(0),
        ..ClientConfig::new(addrs.to_vec(), JOB, Duration::from_secs(5), Duration::from_secs(10))
    };
    let mut client = Client::connect(&config).unwrap();
    // Only the layout of the dense part matters to a push without one.
    use oar::table::{DenseSpec, Optimizer, TableSpec};
    let dense = DenseSpec { params: Vec::new(), block_size: 1, seed: 0, optimizer: Optimizer::sgd(0.1) };
    client.attach(&TableSpec { dense, sparse: Vec::new() });
    client
}

fn refusal(e: ClientError) -> String {
    match e {
        ClientError::Refused { message, .. } => message,
        other => panic!("expected a refusal, got {other}"),
    }
}

/// Numbers no trainer sends: a step far past the window (which would make the real steps
/// repeats), steps and passes near the top of their range, sample counts of no batch, a day end
/// from the far future (which would make every real day end a repeat), pass ends and AUC
/// histograms of passes ahead.
#[test]
#[cfg_attr(not(feature = "faults"), ignore = "plants faults: run with --features faults")]
fn a_peer_with_the_secret_cannot_push_numbers_from_the_far_future_or_of_no_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 3000, 0);
    let secret_file = dir.path().join("secret");
    Secret::generate().write_new(&secret_file).unwrap();
    let secret = Secret::read(&secret_file).unwrap();
    let (attacked, clean) = (dir.path().join("attacked"), dir.path().join("clean"));
    std::fs::create_dir_all(&attacked).unwrap();
    std::fs::create_dir_all(&clean).unwrap();
    let refused = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = refused.clone();
    let attack = move |addrs: &[String]| {
        // A fresh connection each: a client that met a refusal does not read its other replies.
        let header =
            StepHeader { trainer: 0, step: 5, pass: 1, base_version: 0, samples: 200, apply: Default::default() };
        for (what, h) in [
            ("step 10^6", StepHeader { step: 1_000_000, ..header }),
            ("step 2^60", StepHeader { step: 1 << 60, ..header }),
            ("step u64::MAX", StepHeader { step: u64::MAX, ..header }),
            ("pass 2^31", StepHeader { pass: 1 << 31, ..header }),
            ("samples 2^64 - 1", StepHeader { samples: usize::MAX, ..header }),
            ("no sample", StepHeader { samples: 0, ..header }),
        ] {
            let m = refusal(insider(addrs, &secret).push(&h, None, &[]).unwrap_err());
            seen.lock().unwrap().push((what, m));
        }
        let m = refusal(insider(addrs, &secret).shrink_day_end(u32::MAX).unwrap_err());
        seen.lock().unwrap().push(("a day end after pass 2^32 - 1", m));
        // A pass end or an AUC histogram from the far future: accepted, the first moved the
        // pass every bound counts from (so far-future pushes and day ends went through after
        // it) and stopped the step waiting for trainer 0, and three of the second pushed every
        // real histogram out of the server's keeping.
        for pass in [u32::MAX, 3] {
            let m = refusal(insider(addrs, &secret).end_pass(0, pass).unwrap_err());
            seen.lock().unwrap().push(("a pass end", m));
        }
        let none = oar::observe::metrics::AucBuckets::default();
        for pass in [u32::MAX, u32::MAX - 1, 3] {
            let m = refusal(insider(addrs, &secret).pass_auc(0, pass, &none).unwrap_err());
            seen.lock().unwrap().push(("an AUC histogram", m));
        }
        let m = refusal(insider(addrs, &secret).shrink_day_end(3).unwrap_err());
        seen.lock().unwrap().push(("a day end after pass 3, after the rest", m));
    };
    let stats = GuardedJob::new(&attacked, &train, &secret_file).run(Some(&attack));
    let undisturbed = GuardedJob::new(&clean, &train, &secret_file).run(None);
    let refused = refused.lock().unwrap().clone();
    let expected = [
        "trainer 0's push refused: step 1000000 is past this trainer's window: its step 5 is not handled yet",
        "step 1152921504606846976 is past this trainer's window",
        "step 18446744073709551615 is past this trainer's window",
        "it is of pass 2147483648, the trainers are in pass 1 at most",
        "18446744073709551615 samples: a batch holds 1 to 16777216",
        "0 samples: a batch holds 1 to 16777216",
        "a day end's shrink after pass 4294967295 refused: the trainers are in pass 1 at most",
        "trainer 0's end of pass 4294967295 refused: the trainers are in pass 1 at most",
        "trainer 0's end of pass 3 refused: the trainers are in pass 1 at most",
        "trainer 0's AUC of pass 4294967295 refused: the trainers are in pass 1 at most",
        "trainer 0's AUC of pass 4294967294 refused",
        "trainer 0's AUC of pass 3 refused",
        "a day end's shrink after pass 3 refused: the trainers are in pass 1 at most",
    ];
    assert_eq!(refused.len(), expected.len());
    for ((what, message), e) in refused.iter().zip(expected) {
        assert!(message.contains(e), "{what}: {message}");
    }
    // Counted by the servers: the same updates, samples and rows as undisturbed, and the model
    // bit for bit.
    let work =
        |s: &[ServerStats]| s.iter().map(|s| (s.version, s.keys_pushed, s.applied_samples.clone())).collect::<Vec<_>>();
    assert_eq!(work(&stats), work(&undisturbed));
    assert_same_params(&load_params(&attacked.join("out")), &load_params(&clean.join("out")), 0.0);
}

/// A declaration refused (tables with blocks of 0 floats) keeps nothing of itself: its model
/// description and its online calendar were kept before, so the final save described another
/// model and the real online trainer, listing its own days, was refused.
#[test]
fn a_refused_declaration_leaves_nothing_behind() {
    use oar::protocol::{Declaration, ListedDay};
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("stream").display().to_string();
    let o = oar(&["gen", "stream", "--days", "1", "--lines-per-day", "2000", "--parts", "1", "--out", &stream]);
    assert!(o.status.success(), "{}", text(&o));
    let secret_file = dir.path().join("secret");
    Secret::generate().write_new(&secret_file).unwrap();
    let (secret_arg, final_dir) = (secret_file.display().to_string(), dir.path().join("final"));
    let final_arg = final_dir.display().to_string();
    let args = ["--index", "0", "--num-servers", "1", "--trainers", "1", "--mode", "sync", "--job", JOB];
    let rest = ["--secret-file", &secret_arg, "--save-dir", &final_arg, "--trainer-rejoin", "60", "--timeout", "60"];
    let (server, addr) = pserver_ready(&[&args[..], &rest].concat(), std::process::Stdio::piped());

    let mut c = insider(std::slice::from_ref(&addr), &Secret::read(&secret_file).unwrap());
    let mut spec = crate::robustness::spec();
    spec.dense.block_size = 0;
    let day = ListedDay { day: "19990101".into(), files: 1, bytes: 1, digest: "0".repeat(64) };
    let bogus = Declaration { spec, model: serde_json::json!({"model": "not this one"}), calendar: vec![day] };
    let m = refusal(c.declare_with(bogus).unwrap_err());
    assert!(m.contains("block"), "{m}");
    drop(c);

    let o = oar(&[
        "train",
        "--servers",
        &addr,
        "--trainers",
        "1",
        "--trainer-id",
        "0",
        "--mode",
        "sync",
        "--job",
        JOB,
        "--secret-file",
        &secret_arg,
        "--online",
        &stream,
        "--days",
        "20260101..20260101",
        "--passes-per-day",
        "1",
        "--batch-size",
        "200",
        "--hidden",
        "8",
    ]);
    assert!(o.status.success(), "the real trainer: {}", text(&o));
    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{}", String::from_utf8_lossy(&served.stderr));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(final_dir.join("manifest.json")).unwrap()).unwrap();
    assert!(manifest["model"]["model"].is_object(), "the real model described: {}", manifest["model"]);
}

/// A save into a folder holding a complete pass, or a save for serving into one holding a
/// complete save for serving, is refused by the server: a peer asking for either destroyed what
/// it held.
#[test]
fn a_complete_save_is_never_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 500, 0);
    let out = dir.path().join("out");
    let o = oar(&[
        "train",
        "--train",
        &train.display().to_string(),
        "--output",
        &out.display().to_string(),
        "--hidden",
        "8",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let pass = out.join("pass-0001");
    let before: Vec<Vec<u8>> =
        ["manifest.json", "server-0.shard"].iter().map(|f| std::fs::read(pass.join(f)).unwrap()).collect();
    let serving = out.join("serving/base-000-00001");
    std::fs::create_dir_all(&serving).unwrap();
    std::fs::write(serving.join("export.json"), b"{}").unwrap();

    let root = out.display().to_string();
    let args = ["--index", "0", "--num-servers", "1", "--trainers", "1", "--job", JOB, "--keep-serving"];
    let (mut server, addr) = pserver_ready(&[&args[..], &["--save-root", &root]].concat(), std::process::Stdio::null());
    let config = ClientConfig {
        trainer: Some(0),
        ..ClientConfig::new(vec![addr], JOB, Duration::from_secs(5), Duration::from_secs(10))
    };
    let mut c = Client::connect(&config).unwrap();
    c.declare(&crate::robustness::spec()).unwrap();
    let m = refusal(c.save(&pass.display().to_string()).unwrap_err());
    assert!(m.contains("it holds a completed pass (manifest.json), never overwritten"), "{m}");
    let mut c = Client::connect(&config).unwrap();
    c.attach(&crate::robustness::spec());
    let m = refusal(c.export(&serving.display().to_string(), oar::protocol::ExportKind::Base).unwrap_err());
    assert!(m.contains("it holds a completed save for serving (export.json)"), "{m}");
    server.kill().unwrap();
    server.wait().unwrap();
    let after: Vec<Vec<u8>> =
        ["manifest.json", "server-0.shard"].iter().map(|f| std::fs::read(pass.join(f)).unwrap()).collect();
    assert!(before == after, "the complete pass is as it was");
    assert!(!serving.join(oar::persist::export::file_name(0)).exists());
}

/// Starts `oar pserver` for job [`JOB`] as server `index` of `of`, 2 trainers, with the master
/// secret `secret` and `extra` flags; returns it and its address.
fn guarded_pserver(secret: &std::path::Path, index: usize, of: usize, extra: &[&str]) -> (std::process::Child, String) {
    let (index, of, secret) = (index.to_string(), of.to_string(), secret.display().to_string());
    let args = ["--index", &index, "--num-servers", &of, "--trainers", "2", "--job", JOB, "--keep-serving"];
    let guard = ["--mode", "async", "--secret-file", &secret];
    pserver_ready(&[&args[..], &guard, extra].concat(), std::process::Stdio::null())
}

/// A new master secret in `dir`, as `oar launch` makes one.
fn new_master(dir: &std::path::Path) -> std::path::PathBuf {
    let master = dir.join("master");
    Secret::generate().write_new(&master).unwrap();
    master
}

/// `oar secret` derives a credential for `identity` (`--trainer N`, `--tool`, `--operator`).
fn credential(dir: &std::path::Path, master: &std::path::Path, identity: &[&str], name: &str) -> Secret {
    let out = dir.join(name);
    let o = oar(&[
        &["secret", "--master", &master.display().to_string(), "--job", JOB][..],
        identity,
        &["--out", &out.display().to_string()],
    ]
    .concat());
    assert!(o.status.success(), "{}", text(&o));
    Secret::read(&out).unwrap()
}

/// Each process proves its own identity: trainer 1's credential cannot speak for trainer 0, a
/// tool's only reads (no push, save, shrink or claim of a newer epoch), an operator's shrinks,
/// and a process holding the master may still act as any (the launchers' heartbeats, and jobs
/// started before credentials).
#[test]
fn a_credential_acts_for_its_own_identity_only() {
    let dir = tempfile::tempdir().unwrap();
    let master = new_master(dir.path());
    let (mut server, addr) = guarded_pserver(&master, 0, 1, &[]);
    let connect = |secret: Secret, trainer: Option<u64>| {
        let config = ClientConfig {
            secret: Some(secret),
            trainer,
            ..ClientConfig::new(vec![addr.clone()], JOB, Duration::from_secs(5), Duration::from_secs(10))
        };
        Client::connect(&config)
    };
    let t1 = credential(dir.path(), &master, &["--trainer", "1"], "trainer-1");
    let tool = credential(dir.path(), &master, &["--tool"], "tool");
    let operator = credential(dir.path(), &master, &["--operator"], "operator");
    // The client refuses to claim what its credential is not; a peer that tries it at the
    // server (a Hello naming trainer 0 after proving trainer 1) is refused there.
    let e = connect(t1.clone(), Some(0)).map(drop).unwrap_err().to_string();
    assert!(e.contains("the credential (--secret-file) is trainer 1's, this process is trainer 0"), "{e}");
    let e = hello_as(&addr, &t1, oar::security::auth::Identity::Trainer(1), 0);
    assert!(e.contains("this connection proved it is trainer 1 and names trainer 0: refused"), "{e}");
    // Trainer 1 declares and pushes for itself.
    let mut trainer1 = connect(t1, Some(1)).unwrap();
    trainer1.declare(&crate::robustness::spec()).unwrap();
    let header = StepHeader { trainer: 1, step: 0, pass: 1, base_version: 0, samples: 1, apply: Default::default() };
    trainer1.push(&header, None, &[]).unwrap();
    // A tool: reads only.
    let mut c = connect(tool.clone(), None).unwrap();
    c.attach(&crate::robustness::spec());
    assert_eq!(c.stats().unwrap()[0].applied_samples, [0, 1]);
    let m = refusal(connect(tool.clone(), None).unwrap().shrink(36_500).unwrap_err());
    assert!(m.contains("a shrink refused: only an operator may send it") && m.contains("a tool's"), "{m}");
    let mut c = connect(tool.clone(), None).unwrap();
    c.attach(&crate::robustness::spec());
    let m = refusal(c.save(&dir.path().join("x").display().to_string()).unwrap_err());
    assert!(m.contains("a save refused: only trainer 0 or an operator may send it"), "{m}");
    let e = hello_as(&addr, &tool, oar::security::auth::Identity::Tool, u64::MAX);
    assert!(e.is_empty(), "a tool greets as no trainer: {e}");
    // An operator shrinks (nothing to delete here); so does the master's holder.
    connect(operator, None).unwrap().shrink(0).unwrap();
    connect(Secret::read(&master).unwrap(), None).unwrap().shrink(0).unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    // `oar secret` makes no credential that every process would refuse: a job id too long for
    // a credential file, an empty one, one that breaks its lines.
    let long = "j".repeat(5000);
    for (job, refused) in [
        (long.as_str(), "job id of 5000 bytes: its credential would take"),
        ("", "a credential's job id is one line of text, not empty"),
        ("a\nidentity: master", "a credential's job id is one line of text"),
    ] {
        let out = dir.path().join("refused");
        let m = master.display().to_string();
        let o = oar(&["secret", "--master", &m, "--job", job, "--trainer", "0", "--out", &out.display().to_string()]);
        assert!(!o.status.success() && text(&o).contains(refused), "{job:.20}: {}", text(&o));
        assert!(!out.exists());
    }
}

/// A Hello for `trainer` (`u64::MAX`: none) after proving `identity` with `secret`: the
/// server's refusal, or "" if it was welcomed.
fn hello_as(addr: &str, secret: &Secret, identity: oar::security::auth::Identity, trainer: u64) -> String {
    hello_at(addr, secret, identity, trainer, (0, 1))
}

/// [`hello_as`], routing to server `place.0` of `place.1`.
fn hello_at(
    addr: &str,
    secret: &Secret,
    identity: oar::security::auth::Identity,
    trainer: u64,
    place: (u64, u64),
) -> String {
    greet(addr, secret, identity, trainer, place).1
}

/// [`hello_at`], keeping the connection.
fn greet(
    addr: &str,
    secret: &Secret,
    identity: oar::security::auth::Identity,
    trainer: u64,
    (index, servers): (u64, u64),
) -> (std::net::TcpStream, String) {
    use oar::protocol::{auth, read_frame_blocking, FrameBuf, Hello, Request, Response, PROTOCOL_VERSION};
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let ours = oar::security::auth::nonce();
    s.write_all(&auth::hello(&ours, identity, index)).unwrap();
    let mut buf = FrameBuf::default();
    assert_eq!(read_frame_blocking(&mut s, &mut buf, 1 << 10).unwrap(), auth::AUTH_CHALLENGE);
    let (theirs, epoch, _) = auth::parse_challenge(buf.payload()).unwrap();
    let claim = oar::security::auth::Claim { job: JOB, identity, server: index, epoch };
    s.write_all(&auth::proof(&secret.client_proof(&claim, &theirs, &ours).unwrap())).unwrap();
    let kind = read_frame_blocking(&mut s, &mut buf, 1 << 10).unwrap();
    assert!(matches!(Response::decode(kind, buf.payload()).unwrap(), Response::Done), "authenticated");
    let hello = Hello {
        version: PROTOCOL_VERSION,
        job: JOB.into(),
        num_servers: servers,
        server_index: index,
        trainer,
        epoch: 0,
    };
    s.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    let kind = read_frame_blocking(&mut s, &mut buf, 1 << 16).unwrap();
    let refused = match Response::decode(kind, buf.payload()).unwrap() {
        Response::Error { message, .. } => message,
        _ => String::new(),
    };
    (s, refused)
}

/// A server started without its place learns it from the first trainer's handshake, never
/// from a tool's or an operator's: a tool greeting first as server 3 of 4 made every trainer's
/// proof fail ("did not prove it is server 0"), as if the secrets were wrong.
#[test]
fn only_a_trainer_teaches_a_server_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let master = new_master(dir.path());
    let secret = master.display().to_string();
    let args = ["--trainers", "1", "--job", JOB, "--keep-serving", "--mode", "async", "--secret-file", &secret];
    let (mut server, addr) = pserver_ready(&args, std::process::Stdio::null());
    let tool = credential(dir.path(), &master, &["--tool"], "tool");
    let operator = credential(dir.path(), &master, &["--operator"], "operator");
    let (as_tool, as_operator) = (oar::security::auth::Identity::Tool, oar::security::auth::Identity::Operator);
    assert_eq!(hello_at(&addr, &tool, as_tool, u64::MAX, (3, 4)), "", "welcomed where it routes, to read");
    assert_eq!(hello_at(&addr, &operator, as_operator, u64::MAX, (2, 4)), "");
    let t0 = credential(dir.path(), &master, &["--trainer", "0"], "trainer-0");
    let config = ClientConfig {
        secret: Some(t0),
        trainer: Some(0),
        ..ClientConfig::new(vec![addr.clone()], JOB, Duration::from_secs(5), Duration::from_secs(10))
    };
    let mut trainer = Client::connect(&config).unwrap();
    trainer.declare(&crate::robustness::spec()).unwrap();
    // Learned from the trainer: a tool now greets it where the trainer placed it.
    assert_eq!(hello_at(&addr, &tool, as_tool, u64::MAX, (0, 1)), "");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// Every trainer must declare the model the first one did, not only the same tables: a trainer
/// whose job file named other activations (same tables) was accepted, and the final save
/// recorded whichever description came first, so every saved pass could be read as another
/// model (a trainer's credential changed the served predictions from 0.27 to 0.40).
#[test]
fn a_trainer_declaring_another_model_over_the_same_tables_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 3000, 0);
    let master = new_master(dir.path());
    let (secret, train) = (master.display().to_string(), train.display().to_string());
    let args = ["--index", "0", "--num-servers", "1", "--trainers", "2", "--mode", "async", "--job", JOB];
    let (mut server, addr) = pserver_ready(
        &[&args[..], &["--secret-file", &secret, "--timeout", "60"]].concat(),
        std::process::Stdio::null(),
    );
    let trainer = |id: &'static str| {
        let base =
            ["train", "--servers", &addr, "--trainers", "2", "--trainer-id", id, "--mode", "async", "--job", JOB];
        [&base[..], &["--secret-file", &secret, "--train", &train, "--batch-size", "200", "--hidden", "8"]].concat()
    };
    let mut first = spawn_oar(dir.path(), &trainer("0"), "", "worker.0.log");
    let config = ClientConfig {
        secret: Some(Secret::read(&master).unwrap()),
        ..ClientConfig::new(vec![addr.clone()], JOB, Duration::from_secs(5), Duration::from_secs(5))
    };
    // Its pushes wait for trainer 1 (the warm-up's steps are synchronous), but are counted.
    let pushed = || Client::connect(&config).and_then(|mut c| c.stats()).is_ok_and(|s| s[0].pushes > 0);
    wait_until(60, "trainer 0 declared its model and pushed", pushed);
    let other = dir.path().join("sigmoid.toml");
    std::fs::write(&other, "[model]\nhidden = [8]\nactivation = \"sigmoid\"\n").unwrap();
    let o = oar(&[&trainer("1")[..], &["--config", &other.display().to_string()]].concat());
    assert!(!o.status.success(), "trainer 1 trained: {}", text(&o));
    let refused = "this trainer's [model] differs from the one this server holds, which the first trainer declared";
    assert!(text(&o).contains(refused), "{}", text(&o));
    for child in [&mut first, &mut server] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// A tool's credential takes only the tools' share of a server: an eighth of its connections
/// and of its receive buffers. It held every connection (greeted, silent) or the whole receive
/// budget (frames sent half way), and the job's trainers could not even authenticate.
#[test]
fn a_tools_credential_holds_only_the_tools_share_and_the_trainers_keep_theirs() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let master = new_master(dir.path());
    let limits = ["--max-connections", "64", "--max-receive-mb", "64", "--max-frame-mb", "4"];
    let (mut server, addr) = guarded_pserver(&master, 0, 1, &limits);
    let tool = credential(dir.path(), &master, &["--tool"], "tool");
    // Each greeted connection starts a frame of nearly 4 MiB.
    let grads = vec![0.0f32; (1 << 20) - 4096];
    let frame = oar::protocol::Request::Push(dense_push(0, &grads)).encode().to_vec();
    let tool_greets = || greet(&addr, &tool, oar::security::auth::Identity::Tool, u64::MAX, (0, 1));
    let mut held = Vec::new();
    for _ in 0..8 {
        let (s, refused) = tool_greets();
        assert!(refused.is_empty(), "{refused}");
        held.push(s);
    }
    let (_, refused) = tool_greets();
    assert!(refused.contains("the tools' and operators' connections hold 8 connections"), "{refused}");
    // Exactly the header and 2 MiB: a buffer then grows to 4 MiB before reading on, so a
    // refused connection is closed with nothing of its unread (its refusal stays readable).
    for s in &mut held {
        s.write_all(&frame[..oar::protocol::HEADER_BYTES as usize + (2 << 20)]).unwrap();
    }
    // The trainer connects, declares and pushes, with the tool's connections all still open.
    let t0 = credential(dir.path(), &master, &["--trainer", "0"], "trainer-0");
    let config = ClientConfig {
        secret: Some(t0),
        trainer: Some(0),
        ..ClientConfig::new(vec![addr.clone()], JOB, Duration::from_secs(5), Duration::from_secs(10))
    };
    let mut trainer = Client::connect(&config).unwrap();
    trainer.declare(&crate::robustness::spec()).unwrap();
    let header = StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 1, apply: Default::default() };
    trainer.push(&header, None, &[]).unwrap();
    // At most the tools' 8 MiB of buffers: the frames past it were refused, naming it. Each
    // connection's frame is cut short now, so every one is answered and closed.
    let mut answers = Vec::new();
    for s in &mut held {
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = oar::protocol::FrameBuf::default();
        let kind = oar::protocol::read_frame_blocking(s, &mut buf, 1 << 16).unwrap();
        if let Ok(oar::protocol::Response::Error { message, .. }) = oar::protocol::Response::decode(kind, buf.payload())
        {
            answers.push(message);
        }
    }
    let share = answers.iter().filter(|m| m.contains("or this peer's share of them, hold")).count();
    assert_eq!(share, 6, "two frames of 4 MiB fill the tools' 8: {answers:#?}");
    drop(held);
    server.kill().unwrap();
    server.wait().unwrap();
}

/// A process that receives a trainer's connection (a squatted port, a mixed-up address) and
/// relays it to another server of the job gets nowhere: the proof names the server the
/// trainer dialed, and the real server proves another index.
#[test]
fn a_proof_relayed_to_another_server_of_the_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let master = new_master(dir.path());
    let (mut server1, addr1) = guarded_pserver(&master, 1, 2, &[]);
    // The relay listens where the trainer expects server 0 and forwards every byte to server 1.
    let relay = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for inbound in relay.incoming().flatten() {
            let outbound = std::net::TcpStream::connect(&addr1).unwrap();
            let (mut in_r, mut in_w) = (inbound.try_clone().unwrap(), inbound);
            let (mut out_r, mut out_w) = (outbound.try_clone().unwrap(), outbound);
            std::thread::spawn(move || std::io::copy(&mut in_r, &mut out_w));
            std::thread::spawn(move || std::io::copy(&mut out_r, &mut in_w));
        }
    });
    let t0 = credential(dir.path(), &master, &["--trainer", "0"], "trainer-0");
    let config = ClientConfig {
        secret: Some(t0),
        trainer: Some(0),
        ..ClientConfig::new(vec![relay_addr, "127.0.0.1:1".into()], JOB, Duration::from_secs(5), Duration::from_secs(5))
    };
    let e = Client::connect(&config).map(drop).unwrap_err().to_string();
    assert!(e.contains("the server did not prove it is server 0 of job") && e.contains("a relay"), "{e}");
    server1.kill().unwrap();
    server1.wait().unwrap();
}

/// A greeted peer's 64 MiB push for a trainer it is not, refused: 3 of them left 385 MiB held by
/// their idle connections. A refused frame's buffer is given back at once, and every
/// connection's buffer counts against one budget: a frame past it is refused, naming the flag.
#[test]
fn refused_frames_are_not_held_and_all_buffers_share_one_budget() {
    use oar::protocol::{read_frame_blocking, FrameBuf, Hello, Request, Response};
    use std::io::Write;
    let args = ["--index", "0", "--num-servers", "1", "--trainers", "2", "--job", JOB, "--keep-serving"];
    let limits = ["--max-frame-mb", "128", "--max-receive-mb", "100"];
    let (mut server, addr) = pserver_ready(&[&args[..], &limits].concat(), std::process::Stdio::null());
    let greeted = || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let hello = Hello {
            version: oar::protocol::PROTOCOL_VERSION,
            job: JOB.into(),
            num_servers: 1,
            server_index: 0,
            trainer: u64::MAX,
            epoch: 0,
        };
        s.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
        let mut buf = FrameBuf::default();
        let kind = read_frame_blocking(&mut s, &mut buf, 1 << 16).unwrap();
        assert!(matches!(Response::decode(kind, buf.payload()).unwrap(), Response::Welcome { .. }));
        s
    };
    let reply = |s: &mut std::net::TcpStream| {
        let mut buf = FrameBuf::default();
        let kind = read_frame_blocking(s, &mut buf, 1 << 16).unwrap();
        match Response::decode(kind, buf.payload()).unwrap() {
            Response::Error { message, .. } => message,
            other => format!("{other:?}"),
        }
    };
    let grads = vec![0.0f32; 16 << 20]; // 64 MiB
    let frame = Request::Push(dense_push(1, &grads)).encode().to_vec();
    let before = crate::security::rss_mib(server.id());
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut s = greeted();
        s.write_all(&frame).unwrap();
        let m = reply(&mut s);
        assert!(m.contains("request for trainer 1 refused"), "{m}");
        idle.push(s);
    }
    let after = crate::security::rss_mib(server.id());
    assert!(after < before + 64, "three refused 64 MiB frames held {} MiB", after - before);
    // One connection half way through a 64 MiB frame holds 64 MiB of the 100; a second frame
    // that would take the buffers past them is refused, naming the flag.
    let mut holding = greeted();
    holding.write_all(&frame[..40 << 20]).unwrap();
    let mut second = greeted();
    second.write_all(&frame[..8]).unwrap();
    let _ = second.write_all(&frame[8..40 << 20]);
    let m = reply(&mut second);
    assert!(
        m.contains("the receive buffers of this server's connections, or this peer's share of them, hold")
            && m.contains("--max-receive-mb"),
        "{m}"
    );
    drop((holding, idle));
    server.kill().unwrap();
    server.wait().unwrap();
}
