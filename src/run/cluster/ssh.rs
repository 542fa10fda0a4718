//! `oar cluster ssh`: a job over plain ssh, as PaddlePaddle's Fabric launcher (`paddle.py`) did.
//!
//! Every host of the hosts file runs `--servers-per-host` servers and `--trainers-per-host`
//! trainers, all as `oar train <the same arguments>` configured by PaddlePaddle's Fleet
//! variables (`TRAINING_ROLE`, `PADDLE_PSERVERS_IP_PORT_LIST`, ...), so the server list is known
//! before anything starts and no rendezvous is needed. With `--dispatch` the local workspace
//! (without its `log/`) and this binary are first copied to every host.
//!
//! Each process is started by a small remote shell wrapper over its own ssh session: the process
//! runs in a session of its own (`setsid`) with its output in `<workspace>/log/<name>.log` on
//! its host; the wrapper prints `OAR_PID <pid>`, streams that log back (a local copy is kept and
//! the trainers' progress lines feed one merged progress bar), waits for the process and exits
//! with its status. On Ctrl-C or any failure the launcher kills every remote process group by
//! that PID over fresh ssh connections (SIGTERM, then SIGKILL after a grace period): killing a
//! local ssh client alone would leave the remote process running. Should the launcher itself be
//! killed, a watchdog in the wrapper sees the ssh session's stdin (held open by the launcher)
//! end, and stops the process group.
//!
//! Why by PID, never by dropping the ssh client: without a tty a remote process outlives its ssh
//! client (verified in `../shared/research/cluster.md` 4d). With `--max-restarts` a process that
//! failed is started again on its host (`Restarts`, a `supervise::Keeper`); every process is then
//! `--recoverable` and works out from disk what it is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::run::supervise::{
    check_children, interrupt_flag, kill_all, spawn, summarize, wait_for_servers, wait_for_trainers, Keeper,
    LaunchSummary, Proc, Restart,
};

/// What to run where.
#[derive(Clone, Debug)]
pub struct SshConfig {
    /// ssh destinations (`host` or `user@host`), one per machine; the host part is also the
    /// address servers listen on and trainers connect to.
    pub hosts: Vec<String>,
    /// The local workspace: copied to every host with `dispatch`.
    pub workspace: PathBuf,
    /// The workspace's path on the hosts [default: the local path].
    pub remote_workspace: Option<String>,
    /// Copy the workspace and this binary to every host first.
    pub dispatch: bool,
    /// Servers per host.
    pub servers_per_host: usize,
    /// Trainers per host.
    pub trainers_per_host: usize,
    /// A host's first server port (further servers on the next ports).
    pub port: u16,
    /// An ssh client configuration file (`ssh -F`).
    pub ssh_config: Option<PathBuf>,
    /// The `oar` binary on the hosts [default: the dispatched copy with `dispatch`, else `oar`].
    pub oar_bin: Option<String>,
    /// Arguments of `oar train`, the same for every process.
    pub train_args: Vec<String>,
    /// Local copies of every process's log.
    pub logs: PathBuf,
    /// Show a progress bar.
    pub progress_bar: bool,
    /// Restart a process that fails, on its host with its command line, at most this many times
    /// in all; every process is then `--recoverable` (see `oar train --recoverable`).
    pub max_restarts: usize,
}

/// Reads a hosts file: one ssh destination per line; blank lines and `#` comments are skipped.
pub fn parse_hosts(text: &str, file: &Path) -> anyhow::Result<Vec<String>> {
    let mut hosts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        anyhow::ensure!(
            !line.contains(char::is_whitespace),
            "{}:{}: expected one host per line, got {line:?}",
            file.display(),
            n + 1
        );
        // A destination is passed to ssh as an argument: one starting with `-` was an ssh
        // option (`-oProxyCommand=...` runs a command here), so only a plain `[user@]host`.
        anyhow::ensure!(
            !line.starts_with('-') && line.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-@:[]".contains(&b)),
            "{}:{}: {line:?} is not an ssh destination ([user@]host: letters, digits, '.', '_', '-', ':', brackets)",
            file.display(),
            n + 1
        );
        hosts.push(line.to_string());
    }
    anyhow::ensure!(!hosts.is_empty(), "{}: no hosts listed", file.display());
    Ok(hosts)
}

/// The address part of an ssh destination (`user@host` -> `host`).
fn address(destination: &str) -> &str {
    destination.rsplit_once('@').map_or(destination, |(_, h)| h)
}

/// Quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// One process of the job.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// `server.<i>` or `trainer.<i>` (its log's name).
    pub name: String,
    /// Index of its host in the hosts list.
    pub host: usize,
    /// Fleet variables configuring it.
    pub env: Vec<(String, String)>,
}

/// Where every server and trainer runs and how each is configured: servers first.
pub fn placements(config: &SshConfig, job: &str) -> Vec<Placement> {
    let (sp, tp) = (config.servers_per_host, config.trainers_per_host);
    let endpoint = |h: usize, k: usize| format!("{}:{}", address(&config.hosts[h]), config.port as usize + k);
    let list: Vec<String> =
        (0..config.hosts.len()).flat_map(|h| (0..sp).map(move |k| (h, k))).map(|(h, k)| endpoint(h, k)).collect();
    let trainers = config.hosts.len() * tp;
    let common = |role: &str| {
        vec![
            ("TRAINING_ROLE".to_string(), role.to_string()),
            ("PADDLE_PSERVERS_IP_PORT_LIST".to_string(), list.join(",")),
            ("PADDLE_TRAINERS_NUM".to_string(), trainers.to_string()),
            ("OAR_JOB".to_string(), job.to_string()),
            ("OAR_LAUNCHED".to_string(), "1".to_string()),
        ]
        .into_iter()
        .chain((config.max_restarts > 0).then(|| ("OAR_RECOVERABLE".to_string(), "true".to_string())))
        .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for h in 0..config.hosts.len() {
        for k in 0..sp {
            let mut env = common("PSERVER");
            env.push(("POD_IP".into(), address(&config.hosts[h]).into()));
            env.push(("PADDLE_PORT".into(), (config.port as usize + k).to_string()));
            env.push(("OAR_HOST".into(), address(&config.hosts[h]).into()));
            out.push(Placement { name: format!("server.{}", h * sp + k), host: h, env });
        }
    }
    for h in 0..config.hosts.len() {
        for k in 0..tp {
            let mut env = common("TRAINER");
            env.push(("PADDLE_TRAINER_ID".into(), (h * tp + k).to_string()));
            out.push(Placement { name: format!("trainer.{}", h * tp + k), host: h, env });
        }
    }
    out
}

/// Writes the job's secret files on each host (the master where servers run, each trainer's
/// credential where it runs) and points every placement's `OAR_SECRET_FILE` at its own;
/// returns, per host, the files written there.
fn secret_files(
    config: &SshConfig,
    master: &crate::security::auth::Secret,
    remote: &str,
    job: &str,
    placements: &mut [Placement],
) -> anyhow::Result<Vec<Vec<String>>> {
    let mut files: Vec<Vec<String>> = vec![Vec::new(); config.hosts.len()];
    for p in placements.iter_mut() {
        let trainer = p.env.iter().find(|(k, _)| k == "PADDLE_TRAINER_ID").map(|(_, v)| v.clone());
        let (file, secret) = match trainer {
            Some(t) => {
                let id = crate::security::auth::Identity::Trainer(t.parse().context("a trainer id")?);
                (format!("{remote}/.oar/credential.{job}.trainer-{t}"), master.derive(job, id)?)
            }
            None => (format!("{remote}/.oar/secret.{job}"), master.clone()),
        };
        p.env.push(("OAR_SECRET_FILE".into(), file.clone()));
        if files[p.host].contains(&file) {
            continue;
        }
        let (ws, quoted) = (sh_quote(remote), sh_quote(&file));
        let script = format!("umask 077 && mkdir -p {ws}/.oar && cat > {quoted}.part && mv -f {quoted}.part {quoted}");
        let host = &config.hosts[p.host];
        run_remote_with_input(config, host, &script, &secret.bytes())
            .with_context(|| format!("sending {}'s secret to {host}", p.name))?;
        files[p.host].push(file);
    }
    Ok(files)
}

/// The remote shell script that starts one process and watches it (see the module doc).
pub fn wrapper(workspace: &str, oar: &str, p: &Placement, args: &[String]) -> String {
    let log = format!("log/{}.log", p.name);
    let exports: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={}", sh_quote(v))).collect();
    let args: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    format!(
        "cd {ws} && mkdir -p log && : > {log} || exit 1\n\
         export {exports}\n\
         exec 3<&0\n\
         setsid {oar} train {args} >> {log} 2>&1 < /dev/null 3<&- &\n\
         pid=$!\n\
         echo \"OAR_PID $pid\"\n\
         (cat <&3 >/dev/null 2>&1; kill -TERM -- -$pid) >/dev/null 2>&1 &\n\
         w=$!\n\
         tail -n +1 -s 0.2 -f --pid=$pid {log} 3<&- &\n\
         t=$!\n\
         wait $pid; rc=$?\n\
         kill $w 2>/dev/null\n\
         wait $t\n\
         exit $rc\n",
        ws = sh_quote(workspace),
        exports = exports.join(" "),
        oar = sh_quote(oar),
        args = args.join(" "),
    )
}

fn ssh(config: &SshConfig, host: &str) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args(["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]);
    if let Some(f) = &config.ssh_config {
        cmd.arg("-F").arg(f);
    }
    // `--`: whatever the destination, ssh takes it as one, never as an option.
    cmd.arg("--").arg(host);
    cmd
}

/// Runs `script` on `host`, failing with its output.
fn run_remote(config: &SshConfig, host: &str, script: &str, stdin: Stdio) -> anyhow::Result<()> {
    let out = ssh(config, host)
        .arg(script)
        .stdin(stdin)
        .output()
        .with_context(|| format!("cannot run ssh (is the ssh client installed?) for {host}"))?;
    anyhow::ensure!(
        out.status.success(),
        "on {host}: `{}` failed ({}): {}",
        script.lines().next().unwrap_or(""),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Runs `script` on `host` with `input` on its standard input, failing with its output.
fn run_remote_with_input(config: &SshConfig, host: &str, script: &str, input: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = ssh(config, host)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run ssh (is the ssh client installed?) for {host}"))?;
    let written = child.stdin.take().expect("piped").write_all(input);
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        written.is_ok() && out.status.success(),
        "on {host}: `{}` failed ({}): {}",
        script.lines().next().unwrap_or(""),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Copies the workspace (without `log/`) and this binary (as `.oar/oar`) to `host`.
fn dispatch(config: &SshConfig, host: &str, remote: &str) -> anyhow::Result<()> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&config.workspace)
        .args(["--exclude=./log", "--exclude=./.oar", "-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run tar")?;
    let ws = sh_quote(remote);
    let copied = run_remote(
        config,
        host,
        &format!("mkdir -p {ws} && tar -C {ws} -xf -"),
        tar.stdout.take().expect("piped").into(),
    );
    let status = tar.wait()?;
    copied?;
    anyhow::ensure!(status.success(), "tar of {} failed ({status})", config.workspace.display());
    let exe = std::env::current_exe().context("cannot find the oar binary")?;
    let file = std::fs::File::open(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    run_remote(
        config,
        host,
        &format!("mkdir -p {ws}/.oar && cat > {ws}/.oar/oar.part && chmod +x {ws}/.oar/oar.part && mv {ws}/.oar/oar.part {ws}/.oar/oar"),
        file.into(),
    )
}

/// Kills the remote process groups of `procs` (SIGTERM, then SIGKILL after a grace period),
/// then the local ssh clients.
fn stop_remote(config: &SshConfig, procs: &mut [Proc], hosts: &[usize]) {
    // A process whose wrapper has not yet said its PID is given a moment to say it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs.iter_mut().any(|p| p.with_state(|s| s.remote_pid.is_none()) && matches!(p.child.try_wait(), Ok(None)))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for signal in ["TERM", "KILL"] {
        let mut by_host: Vec<Vec<u32>> = vec![Vec::new(); config.hosts.len()];
        for (p, &h) in procs.iter_mut().zip(hosts) {
            if let (Some(pid), Ok(None)) = (p.with_state(|s| s.remote_pid), p.child.try_wait()) {
                by_host[h].push(pid);
            }
        }
        for (h, pids) in by_host.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
            let groups: Vec<String> = pids.iter().map(|p| format!("-{p}")).collect();
            let script = format!("kill -{signal} -- {} 2>/dev/null; true", groups.join(" "));
            if let Err(e) = run_remote(config, &config.hosts[h], &script, Stdio::null()) {
                tracing::warn!(host = %config.hosts[h], error = %e, "could not stop remote processes");
            }
        }
        // The wrappers exit once their process has: wait for that, a few seconds at most.
        let deadline = Instant::now() + Duration::from_secs(5);
        while procs.iter_mut().any(|p| matches!(p.child.try_wait(), Ok(None))) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    kill_all(procs);
}

/// Starts the job's processes on their hosts.
struct Starter<'a> {
    config: &'a SshConfig,
    /// The workspace on the hosts.
    remote: &'a str,
    /// The `oar` binary on the hosts.
    oar: &'a str,
}

impl Starter<'_> {
    /// Starts `p` (its `life`-th restart) through its own ssh session.
    fn start(&self, p: &Placement, life: u64) -> anyhow::Result<Proc> {
        let host = &self.config.hosts[p.host];
        let mut p = p.clone();
        let mut name = format!("{} on {host}", p.name.replace('.', " "));
        if life > 0 {
            p.name = format!("{}.restart-{life}", p.name);
            name = format!("{name} (restart {life})");
        }
        let mut cmd = ssh(self.config, host);
        // Held open and never written: if this launcher dies, the remote wrapper sees its
        // stdin end and stops the process (the watchdog in `wrapper`).
        cmd.arg(wrapper(self.remote, self.oar, &p, &self.config.train_args)).stdin(Stdio::piped());
        spawn(cmd, &name, self.config.logs.join(format!("{}.log", p.name)), None)
    }
}

/// `--max-restarts`: a process that failed is started again on its host with its command line;
/// being `--recoverable`, it finds there what it needs to go on (a server its checkpoints and
/// epoch, a trainer its position) while the others wait for it.
struct Restarts<'a> {
    starter: Starter<'a>,
    placements: &'a [Placement],
    /// Restarts of each process so far.
    lives: Vec<u64>,
    restarts: Vec<Restart>,
    started: Instant,
}

impl Keeper for Restarts<'_> {
    fn restarts(&self) -> bool {
        self.starter.config.max_restarts > 0
    }

    fn restart(&mut self, procs: &mut [Proc], i: usize, status: std::process::ExitStatus) -> anyhow::Result<bool> {
        // 255 is ssh's own failure: the remote process may still run, so it is not started twice.
        if self.restarts.len() >= self.starter.config.max_restarts || status.code() == Some(255) {
            return Ok(false);
        }
        self.lives[i] += 1;
        let life = self.lives[i];
        let cause = status.to_string();
        let failed = std::mem::replace(&mut procs[i], self.starter.start(&self.placements[i], life)?);
        tracing::warn!(process = %failed.name, life, "failed ({cause}); restarting it");
        eprintln!("{} failed ({cause}); restarting it (restart {life})", failed.name);
        self.restarts.push(Restart {
            process: failed.name,
            epoch: life,
            at_seconds: self.started.elapsed().as_secs_f64(),
            cause,
            from: None,
        });
        Ok(true)
    }
}

/// Runs the job over ssh and returns its summary; on any failure or Ctrl-C every remote
/// process is stopped first.
pub fn run(config: &SshConfig) -> anyhow::Result<LaunchSummary> {
    check(config)?;
    let started = Instant::now();
    let remote = match &config.remote_workspace {
        Some(r) => r.clone(),
        None => std::path::absolute(&config.workspace)?.display().to_string(),
    };
    let oar = match (&config.oar_bin, config.dispatch) {
        (Some(bin), _) => bin.clone(),
        (None, true) => "./.oar/oar".to_string(),
        (None, false) => "oar".to_string(),
    };
    std::fs::create_dir_all(&config.logs).with_context(|| format!("cannot create {}", config.logs.display()))?;
    let interrupted = interrupt_flag();
    if config.dispatch {
        // One host after another: hosts may share a file system (and then the same folder).
        for host in &config.hosts {
            tracing::info!(%host, workspace = %remote, "dispatching the workspace");
            dispatch(config, host, &remote)?;
        }
    }
    let job = format!("oar-ssh-{}-{}", std::process::id(), started.elapsed().as_nanos());
    // A new secret for the job, sent over ssh's standard input into files only their owner
    // reads (never on a command line, where `ps` would show it): the master to the hosts of
    // servers, and to each trainer only its own credential (see `auth`).
    let secret = crate::security::auth::Secret::generate();
    let mut placements = placements(config, &job);
    let files = secret_files(config, &secret, &remote, &job, &mut placements)?;
    let hosts: Vec<usize> = placements.iter().map(|p| p.host).collect();
    let mut procs: Vec<Proc> = Vec::new();
    let mut keeper = Restarts {
        starter: Starter { config, remote: &remote, oar: &oar },
        placements: &placements,
        lives: vec![0; placements.len()],
        restarts: Vec::new(),
        started,
    };
    let result = supervise(config, &mut keeper, &mut procs, &interrupted);
    // Servers still up after their trainers finished (--keep-serving) are stopped as well.
    stop_remote(config, &mut procs, &hosts);
    remove_secrets(config, &files);
    result
}

/// The hosts and counts checked before anything is started.
fn check(config: &SshConfig) -> anyhow::Result<()> {
    anyhow::ensure!(!config.hosts.is_empty(), "no hosts");
    anyhow::ensure!(config.servers_per_host >= 1, "--servers-per-host must be at least 1");
    anyhow::ensure!(config.trainers_per_host >= 1, "--trainers-per-host must be at least 1");
    let max = crate::base::layout::MAX_PEERS;
    let (servers, trainers) = (
        config.hosts.len().checked_mul(config.servers_per_host),
        config.hosts.len().checked_mul(config.trainers_per_host),
    );
    anyhow::ensure!(
        servers.is_some_and(|n| n <= max) && trainers.is_some_and(|n| n <= max),
        "{} hosts x --servers-per-host {} / --trainers-per-host {}: at most {max} servers and {max} trainers",
        config.hosts.len(),
        config.servers_per_host,
        config.trainers_per_host
    );
    anyhow::ensure!(
        config.port as usize + config.servers_per_host - 1 <= u16::MAX as usize,
        "--port {} + {} servers per host goes past 65535",
        config.port,
        config.servers_per_host
    );
    Ok(())
}

/// Starts every process, waits for the trainers, then the servers, and sums up.
fn supervise(
    config: &SshConfig,
    keeper: &mut Restarts,
    procs: &mut Vec<Proc>,
    interrupted: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<LaunchSummary> {
    let servers = config.hosts.len() * config.servers_per_host;
    for p in keeper.placements {
        procs.push(keeper.starter.start(p, 0)?);
    }
    let remote = keeper.starter.remote;
    let bar =
        if config.progress_bar { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {pos} samples ({per_sec}) {msg}")
            .expect("the template is valid"),
    );
    bar.set_message(format!(
        "{servers} servers, {} trainers on {} hosts; logs in {}/log on each host",
        keeper.placements.len() - servers,
        config.hosts.len(),
        remote
    ));
    wait_for_trainers(procs, servers, interrupted, keeper, &bar, |_, samples| samples)?;
    bar.finish_and_clear();
    wait_for_servers(procs, servers, interrupted, keeper)?;
    check_children(procs, interrupted, keeper)?;
    let restarts = std::mem::take(&mut keeper.restarts);
    let took = keeper.started.elapsed().as_secs_f64();
    summarize(&procs[..servers], &procs[servers..], took, &config.logs, restarts, None)
}

/// The secret guards only this job: every run leaves some on every host, removed here.
fn remove_secrets(config: &SshConfig, files: &[Vec<String>]) {
    for (host, files) in config.hosts.iter().zip(files) {
        let quoted: Vec<String> = files.iter().map(|f| sh_quote(f)).collect();
        if let Err(e) = run_remote_with_input(config, host, &format!("rm -f {}", quoted.join(" ")), &[]) {
            tracing::warn!(%host, "the job's secret files {files:?} stay there: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hosts: &[&str]) -> SshConfig {
        SshConfig {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            workspace: "ws".into(),
            remote_workspace: None,
            dispatch: false,
            servers_per_host: 1,
            trainers_per_host: 2,
            port: 7164,
            ssh_config: None,
            oar_bin: None,
            train_args: vec![],
            logs: "logs".into(),
            progress_bar: false,
            max_restarts: 0,
        }
    }

    /// Counts and ports are checked before anything runs: 10^8 servers per host took 1 GB
    /// building placements, and port 65534 with 3 per host named port 65536.
    #[test]
    fn server_counts_and_ports_beyond_their_bounds_are_refused_before_anything_runs() {
        let huge = SshConfig { servers_per_host: 100_000_000, ..config(&["a"]) };
        assert!(run(&huge).unwrap_err().to_string().contains("at most 65536 servers"));
        let past = SshConfig { servers_per_host: 3, port: 65534, ..config(&["a"]) };
        assert_eq!(run(&past).unwrap_err().to_string(), "--port 65534 + 3 servers per host goes past 65535");
    }

    #[test]
    fn hosts_files_skip_comments_and_name_bad_lines() {
        let f = Path::new("hosts");
        assert_eq!(parse_hosts("# cluster\nnode1\n\n root@node2  # second\n", f).unwrap(), ["node1", "root@node2"]);
        let err = parse_hosts("a\nb c\n", f).unwrap_err().to_string();
        assert_eq!(err, "hosts:2: expected one host per line, got \"b c\"");
        assert!(parse_hosts("# nothing\n", f).is_err());
        // Never an ssh option, nor anything a shell or ssh reads specially.
        for bad in ["-V", "-oProxyCommand=touch${IFS}/tmp/x", "node1;reboot", "a$(id)"] {
            let err = parse_hosts(&format!("{bad}\n"), f).unwrap_err().to_string();
            assert!(err.contains("is not an ssh destination"), "{bad}: {err}");
        }
        assert_eq!(parse_hosts("user@10.0.0.1\n[::1]\n", f).unwrap(), ["user@10.0.0.1", "[::1]"]);
    }

    #[test]
    fn placements_use_the_fleet_contract_servers_first() {
        let p = placements(&config(&["10.0.0.1", "root@10.0.0.2"]), "j");
        let names: Vec<_> = p.iter().map(|p| (p.name.as_str(), p.host)).collect();
        assert_eq!(
            names,
            [("server.0", 0), ("server.1", 1), ("trainer.0", 0), ("trainer.1", 0), ("trainer.2", 1), ("trainer.3", 1)]
        );
        let get = |p: &Placement, k: &str| p.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get(&p[1], "PADDLE_PSERVERS_IP_PORT_LIST").as_deref(), Some("10.0.0.1:7164,10.0.0.2:7164"));
        assert_eq!(get(&p[1], "POD_IP").as_deref(), Some("10.0.0.2"));
        assert_eq!(get(&p[4], "PADDLE_TRAINER_ID").as_deref(), Some("2"));
        assert_eq!(get(&p[4], "PADDLE_TRAINERS_NUM").as_deref(), Some("4"));
    }

    #[test]
    fn shell_quoting_survives_quotes_and_spaces() {
        assert_eq!(sh_quote("data/train"), "data/train");
        assert_eq!(sh_quote("it's a file"), r"'it'\''s a file'");
        assert_eq!(sh_quote(""), "''");
        let out = Command::new("sh").args(["-c", &format!("printf %s {}", sh_quote("a 'b' $c"))]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a 'b' $c");
    }
}
