//! `oar secret`: a credential for one process of a job, derived from the job's master secret,
//! for engines a user scripts (`oar launch` and the cluster engines make their own).

use std::path::PathBuf;

use clap::Args;

use crate::security::auth::{Identity, Secret};

/// Which process a credential is for, and where it goes.
#[derive(Args)]
pub(super) struct SecretArgs {
    /// The job's master secret (the servers' --secret-file).
    #[arg(long)]
    master: PathBuf,
    /// The job id the credential is for (the processes' --job).
    #[arg(long = "job", env = "OAR_JOB", default_value = "oar")]
    job_id: String,
    /// A credential of this trainer: it may act for this trainer only.
    #[arg(long, conflicts_with_all = ["tool", "operator"], required_unless_present_any = ["tool", "operator"])]
    trainer: Option<u64>,
    /// A tool's credential: it may only read (pulls of existing rows, stats).
    #[arg(long, conflicts_with = "operator")]
    tool: bool,
    /// An operator's credential: shrinks, saves, replacements of servers.
    #[arg(long)]
    operator: bool,
    /// The new credential file (made with mode 0600; an existing file is never overwritten).
    #[arg(long)]
    out: PathBuf,
}

/// Derives the credential `a` asks for and writes it.
pub(super) fn run(a: SecretArgs) -> anyhow::Result<()> {
    let identity = match (a.trainer, a.tool, a.operator) {
        (Some(t), _, _) => Identity::Trainer(t),
        (None, true, _) => Identity::Tool,
        _ => Identity::Operator,
    };
    let master = Secret::read(&a.master)?;
    master.derive(&a.job_id, identity)?.write_new(&a.out)?;
    println!("{}: the credential of {} of job '{}'", a.out.display(), identity.label(), a.job_id);
    Ok(())
}
