//! Cluster engines: processes that know only their rank and the world size (as mpirun and srun
//! start them) meet at rank 0's rendezvous and train 2 servers x 2 trainers to a saved model.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::util::*;

/// `oar train` arguments of a 2 x 2 job; without `rendezvous`, oar derives one (single host).
fn args<'a>(train: &'a str, model: &'a str, rendezvous: Option<&'a str>) -> Vec<&'a str> {
    let meet = rendezvous.map(|r| vec!["--rendezvous", r]).unwrap_or_default();
    let head = vec!["train", "--num-servers", "2"];
    let tail = vec!["--hidden", "16", "--batch-size", "200", "--timeout", "60", "--train", train, "--output", model];
    [head, meet, tail].concat()
}

/// Makes line 1000 of trainer 1's shard (`part-00001` of 2) malformed; returns that file.
fn break_line_1000(train: &Path) -> std::path::PathBuf {
    let file = train.join("part-00001");
    let mut lines: Vec<String> = std::fs::read_to_string(&file).unwrap().lines().map(String::from).collect();
    lines[999] = "1\tnot-a-number".into();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    file
}

fn check_model(model: &Path) {
    let manifest = std::fs::read_to_string(model.join("final/manifest.json")).unwrap();
    assert!(manifest.contains("\"num_servers\": 2"), "{manifest}");
    assert!(model.join("pass-0001/manifest.json").exists(), "trainer 0 saved the pass too");
}

/// Four ranks given only `OMPI_COMM_WORLD_RANK/SIZE`, as `mpirun -n 4` starts them, and the
/// job's secret: the rendezvous and the servers take only them.
#[test]
fn ranks_with_only_mpi_variables_meet_and_train_two_by_two() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    oar::security::auth::Secret::generate().write_new(&secret).unwrap();
    let (train, _) = gen_data(dir.path(), 2, 1500, 0);
    let model = dir.path().join("model");
    let rendezvous = format!("127.0.0.1:{}", free_ports(1));
    let (train, model_s) = (train.display().to_string(), model.display().to_string());
    let children: Vec<_> = (0..4)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_oar"))
                .args(args(&train, &model_s, Some(&rendezvous)))
                .env("OMPI_COMM_WORLD_RANK", rank.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "4")
                .env("OAR_SECRET_FILE", &secret)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Trainers first: they end on their own (done, or failed at the bounded rendezvous); servers
    // end once the trainers have closed, so after a failed trainer they are stopped here.
    let mut children: Vec<_> = children.into_iter().map(Some).collect();
    let output = |c: std::process::Child| {
        let out = c.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let trainers: Vec<_> = (2..4).map(|rank| output(children[rank].take().unwrap())).collect();
    if trainers.iter().any(|(ok, _)| !ok) {
        for c in children.iter_mut().flatten() {
            let _ = c.kill();
        }
    }
    let servers: Vec<_> = (0..2).map(|rank| output(children[rank].take().unwrap())).collect();
    for (rank, (ok, text)) in servers.iter().chain(&trainers).enumerate() {
        assert!(ok, "rank {rank}:\n{text}");
        assert!(!text.contains("has no secret"), "rank {rank}:\n{text}");
        if rank >= 2 {
            assert!(text.contains("trained 1500 samples"), "rank {rank}:\n{text}");
        }
    }
    check_model(&model);
}

/// The MPI launchers installed here (`.ci/run` installs Debian's openmpi-bin and mpich):
/// Open MPI's `mpirun` and MPICH's `mpiexec.hydra`, each starting 4 ranks.
fn mpi_launchers() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut found = Vec::new();
    let open_mpi = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if open_mpi {
        found.push(("Open MPI", vec!["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "4"]));
    } else {
        eprintln!("skipped Open MPI: its mpirun is not installed (.ci/run installs Debian's openmpi-bin)");
    }
    if installed("mpiexec.hydra") {
        found.push(("MPICH", vec!["mpiexec.hydra", "-n", "4"]));
    } else {
        eprintln!("skipped MPICH: mpiexec.hydra is not installed (.ci/run installs Debian's mpich)");
    }
    found
}

/// Runs the job under `launcher`, bounded by `timeout` should the launcher fail to end it; with
/// `explicit`, at a `--rendezvous` on a free port, else at the one oar derives on one host.
fn run_mpi(launcher: &[&str], train: &str, model: &str, explicit: bool) -> (std::process::ExitStatus, String) {
    let rendezvous = format!("127.0.0.1:{}", free_ports(1));
    // Each rank its own file, as a batch script makes them with `oar secret`: the master for
    // the server ranks 0 and 1, trainer t's credential for rank 2 + t.
    let secrets = std::path::Path::new(model).with_extension("secrets");
    let _ = std::fs::remove_dir_all(&secrets);
    std::fs::create_dir_all(&secrets).unwrap();
    let master = secrets.join("master");
    oar::security::auth::Secret::generate().write_new(&master).unwrap();
    for rank in 0..4 {
        let out = secrets.join(format!("rank-{rank}"));
        let made = if rank < 2 {
            oar::security::auth::Secret::read(&master).unwrap().write_new(&out).map(|()| String::new()).unwrap()
        } else {
            let (m, t, o) = (master.display().to_string(), (rank - 2).to_string(), out.display().to_string());
            let made = oar(&["secret", "--master", &m, "--job", "oar", "--trainer", &t, "--out", &o]);
            assert!(made.status.success(), "{}", text(&made));
            text(&made)
        };
        assert!(out.exists(), "{made}");
    }
    let mut cmd = Command::new("timeout");
    cmd.env("OAR_SECRET_FILE", secrets.join("rank-{rank}"));
    cmd.arg("120").args(launcher).arg(env!("CARGO_BIN_EXE_oar"));
    cmd.args(args(train, model, explicit.then_some(rendezvous.as_str()))).env("RUST_LOG", "warn");
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(124), "{launcher:?} did not end within 120 s:\n{text}");
    (out.status, text)
}

/// The same job under real MPI launchers: Open MPI's mpirun and MPICH's Hydra.
#[test]
fn mpi_launchers_train_two_servers_and_two_trainers() {
    for (name, launcher) in mpi_launchers() {
        let dir = tempfile::tempdir().unwrap();
        let (train, _) = gen_data(dir.path(), 2, 1500, 0);
        let model = dir.path().join("model");
        // No --rendezvous: every rank is on this host, so oar derives a loopback one from the job.
        let (status, text) = run_mpi(&launcher, &train.display().to_string(), &model.display().to_string(), false);
        assert!(status.success(), "{name}:\n{text}");
        assert_eq!(text.matches("trained 1500 samples").count(), 2, "{name}:\n{text}");
        // Each trainer rank held its own credential, not the master.
        assert!(!text.contains("master secret"), "{name}:\n{text}");
        check_model(&model);
    }
}

/// A trainer rank failing mid-run (a malformed line deep in its shard) fails the whole MPI job:
/// its one-line error names the file and line, the servers fail at once naming the lost trainer
/// (instead of waiting for it), the launcher stops the rest and exits non-zero.
#[test]
fn a_failing_rank_fails_the_mpi_job_clearly() {
    for (name, launcher) in mpi_launchers() {
        let dir = tempfile::tempdir().unwrap();
        let (train, _) = gen_data(dir.path(), 2, 1500, 0);
        let file = break_line_1000(&train);
        let model = dir.path().join("model");
        let model_s = model.display().to_string();
        let (status, text) = run_mpi(&launcher, &train.display().to_string(), &model_s, true);
        assert!(!status.success(), "{name}:\n{text}");
        assert!(text.contains(&format!("{}:1000: I1 is not an integer", file.display())), "{name}:\n{text}");
        assert!(text.contains("trainer 1 disconnected without closing"), "{name}:\n{text}");
        assert!(!model.join("final/manifest.json").exists(), "{name}: no final model from a failed job");
        assert_eq!(processes_mentioning(&model_s), Vec::<u32>::new(), "{name}: ranks left running");
    }
}

/// A single-node Slurm (munged, slurmctld and slurmd started here with their configuration, key
/// and state in a temporary folder, on loopback ports) runs `srun -n 4 oar train` and the
/// example `sbatch` script to saved models; with a bad line in trainer 1's data the step fails.
#[test]
fn slurm_srun_and_sbatch_train_two_by_two_and_a_failing_rank_fails_the_step() {
    let missing: Vec<_> =
        ["munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo"].into_iter().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        eprintln!(
            "skipped: {missing:?} not installed (.ci/run installs Debian's slurmctld, slurmd, slurm-client, munge)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut daemons = Daemons::default();

    let key: Vec<u8> = (0..1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(d.join("munge.key"), key).unwrap();
    std::fs::set_permissions(d.join("munge.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let socket = d.join("munge.sock");
    let mut munged = Command::new("munged");
    munged.arg("--foreground").arg("--force");
    for (flag, file) in [("key-file", "munge.key"), ("socket", "munge.sock"), ("pid-file", "munged.pid")] {
        munged.arg(format!("--{flag}={}", d.join(file).display()));
    }
    munged.arg(format!("--seed-file={}", d.join("munged.seed").display()));
    munged.arg(format!("--log-file={}", d.join("munged.log").display()));
    daemons.start("munged", &mut munged, &d.join("munged.out")).unwrap();
    wait_until(30, "munged's socket", || {
        daemons.check_running();
        socket.exists()
    });

    // The node is named after this host, so Slurm's node list resolves (to the default
    // rendezvous on the first node).
    // slurmctld compares its short host name with SlurmctldHost.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim().split('.').next().unwrap().to_string();
    let ports = free_ports(2);
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::create_dir_all(d.join("spool")).unwrap();
    let p = |f: &str| d.join(f).display().to_string();
    let conf = format!(
        "ClusterName=oartest\nSlurmctldHost={host}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n\
         AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={}\nStateSaveLocation={}\nSlurmdSpoolDir={}\n\
         SlurmctldPidFile={}\nSlurmdPidFile={}\nSlurmctldPort={}\nSlurmdPort={}\nSlurmctldLogFile={}\n\
         SlurmdLogFile={}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\nReturnToService=2\nMpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\nSchedulerType=sched/backfill\n\
         SlurmdParameters=config_overrides\n\
         NodeName={host} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN\n\
         PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
        p("munge.sock"),
        p("state"),
        p("spool"),
        p("slurmctld.pid"),
        p("slurmd.pid"),
        ports,
        ports + 1,
        p("slurmctld.log"),
        p("slurmd.log"),
    );
    let conf_file = d.join("slurm.conf");
    std::fs::write(&conf_file, conf).unwrap();
    let slurm = |program: &str| {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &conf_file);
        c
    };
    daemons.start("slurmctld", slurm("slurmctld").args(["-D", "-f"]).arg(&conf_file), &d.join("ctld.out")).unwrap();
    daemons
        .start("slurmd", slurm("slurmd").args(["-D", "-N", &host, "-f"]).arg(&conf_file), &d.join("slurmd.out"))
        .unwrap();
    wait_until(60, "the Slurm node to be idle", || {
        daemons.check_running();
        slurm("sinfo")
            .args(["-h", "-o", "%t"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("idle"))
    });

    // The default rendezvous is the first node by name; where this host's name does not resolve
    // (some containers), the test says so and gives it explicitly.
    let mut extra: Vec<String> = Vec::new();
    if std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0)).is_err() {
        eprintln!("note: host name {host:?} does not resolve here: passing --rendezvous 127.0.0.1:PORT");
        extra = vec!["--rendezvous".into(), format!("127.0.0.1:{}", free_ports(1))];
    }
    let (train, _) = gen_data(d, 2, 1500, 0);
    let train = train.display().to_string();
    let srun = |model: &Path| {
        let out = slurm("timeout")
            .args(["120", "srun", "-K", "-n", "4", env!("CARGO_BIN_EXE_oar"), "train", "--servers", "2"])
            .args(["--hidden", "16", "--batch-size", "200", "--timeout", "60", "--train", &train, "--output"])
            .arg(model)
            .args(&extra)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        (out.status, format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let model = d.join("model-srun");
    let (status, text) = srun(&model);
    assert!(status.success(), "srun:\n{text}");
    assert_eq!(text.matches("trained 1500 samples").count(), 2, "{text}");
    check_model(&model);

    let model = d.join("model-sbatch");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/slurm.sbatch");
    let out = slurm("timeout")
        .args(["180", "sbatch", "--wait", "--output"])
        .arg(d.join("sbatch-%j.log"))
        .arg(format!(
            "--export=ALL,OAR={},DATA={train},MODEL={},RUST_LOG=warn",
            env!("CARGO_BIN_EXE_oar"),
            model.display()
        ))
        .arg(&script)
        .args(["--hidden", "16", "--batch-size", "200", "--timeout", "60"])
        .args(&extra)
        .current_dir(d)
        .output()
        .unwrap();
    let logs: String = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sbatch-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let text = format!("{}{}{logs}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "sbatch:\n{text}");
    assert_eq!(logs.matches("trained 1500 samples").count(), 2, "{text}");
    // The script gave the servers a master and each trainer only its own credential.
    assert!(!logs.contains("has no secret") && !logs.contains("master secret"), "{text}");
    check_model(&model);

    // A rank failing mid-run fails the step (srun -K), with its error line.
    let file = break_line_1000(Path::new(&train));
    let model = d.join("model-failed");
    let (status, text) = srun(&model);
    assert!(!status.success() && status.code() != Some(124), "srun:\n{text}");
    assert!(text.contains(&format!("{}:1000: I1 is not an integer", file.display())), "{text}");
    assert!(!model.join("final/manifest.json").exists(), "no final model from a failed job");
}
