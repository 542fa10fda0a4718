//! The program oar starts its own child processes with: this binary, or, under the Python
//! package, the interpreter running `python -m oar`, whose own executable is Python's.

use std::path::PathBuf;
use std::process::Command;

/// A program and the arguments that come before a child's own (`oar launch` starts its servers
/// and trainers as `PROGRAM PREFIX... pserver ...`).
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The executable.
    pub path: PathBuf,
    /// Arguments before the command's (`["-m", "oar"]` for Python).
    pub prefix: Vec<String>,
}

impl Program {
    /// The executable at `path`, with no prefix: an `oar` binary.
    pub fn binary(path: impl Into<PathBuf>) -> Program {
        Program { path: path.into(), prefix: Vec::new() }
    }

    /// This process's own binary.
    pub fn this_binary() -> std::io::Result<Program> {
        Ok(Program::binary(std::env::current_exe()?))
    }

    /// Whether it is an `oar` binary of its own, which can be copied to other hosts or run as
    /// `--baseline-exe`, rather than an interpreter running oar.
    pub fn is_binary(&self) -> bool {
        self.prefix.is_empty()
    }

    /// A command running it, prefix given, to which a child's arguments are added.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.args(&self.prefix);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_comes_before_the_childs_arguments() {
        let python = Program { path: "python3".into(), prefix: vec!["-m".into(), "oar".into()] };
        let mut cmd = python.command();
        cmd.arg("pserver");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            (cmd.get_program().to_string_lossy().as_ref(), args),
            ("python3", vec!["-m".into(), "oar".into(), "pserver".to_string()])
        );
        assert!(!python.is_binary() && Program::binary("/bin/oar").is_binary());
    }
}
