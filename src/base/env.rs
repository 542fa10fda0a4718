//! PaddlePaddle's cluster environment contracts, so jobs written for its parameter-server mode
//! run unchanged: the v2 API's `PADDLE_INIT_*`, the Fluid transpiler's `PADDLE_TRAINING_ROLE`
//! family and Fleet's `TRAINING_ROLE` family (PaddleCloudRoleMaker, also what PaddleFlow's
//! operator and Paddle's launchers set), plus Open MPI's rank as the node id. Sources are listed
//! in `../shared/research/cluster.md` section 1.
//!
//! [`ClusterEnv::read`] looks at one environment and returns what it says as one `ClusterEnv`. It
//! reads a lookup function, not the process's environment, so every contract is unit-tested
//! without touching global state. The command line (`cli/roles.rs`) then applies flag > `OAR_*` >
//! Paddle variable > default, in one place per value. A malformed or missing variable is an error
//! naming it.

/// Which process a command line runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A parameter server.
    Pserver,
    /// A trainer.
    Trainer,
}

/// The PaddlePaddle generation whose variables were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contract {
    /// Fleet / PaddleCloudRoleMaker (`TRAINING_ROLE`, `PADDLE_PSERVERS_IP_PORT_LIST`, ...).
    Fleet,
    /// Fluid transpiler (`PADDLE_TRAINING_ROLE`, `PADDLE_PSERVER_IPS`, ...).
    Fluid,
    /// v2 API (`PADDLE_INIT_*`).
    V2,
    /// None of them.
    None,
}

/// A bad or missing variable.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {var}: {reason}")]
pub struct EnvError {
    /// The variable.
    pub var: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// What the environment says about this process's place in a job. `None`: not said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterEnv {
    /// The generation found.
    pub contract: Option<Contract>,
    /// Server or trainer (Fluid and Fleet name it; v2 uses separate commands).
    pub role: Option<Role>,
    /// Every server's first endpoint `host:port`, by server index.
    pub servers: Option<Vec<String>>,
    /// This server's index among them (servers only).
    pub server_index: Option<usize>,
    /// The port a server listens on.
    pub port: Option<u16>,
    /// The address a server listens on (Fluid's `PADDLE_CURRENT_IP`).
    pub host: Option<String>,
    /// Number of trainers.
    pub trainers: Option<usize>,
    /// This trainer's id.
    pub trainer_id: Option<usize>,
    /// Threads per trainer (v2 `trainer_count`).
    pub trainer_count: Option<usize>,
    /// Consecutive ports per server (v2).
    pub ports_num: Option<usize>,
    /// Sparse-only ports per server (v2).
    pub ports_num_for_sparse: Option<usize>,
    /// v2 `use_gpu`.
    pub use_gpu: Option<bool>,
}

/// PaddlePaddle's default first pserver port.
pub const DEFAULT_PORT: u16 = 7164;

struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn text(&self, var: &'static str) -> Option<String> {
        (self.get)(var).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    fn required(&self, var: &'static str, why: &str) -> Result<String, EnvError> {
        self.text(var).ok_or_else(|| EnvError { var, reason: format!("missing ({why})") })
    }

    fn parse<T: std::str::FromStr>(&self, var: &'static str, what: &str) -> Result<Option<T>, EnvError> {
        match self.text(var) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| EnvError { var, reason: format!("{v:?} is not {what}") }),
        }
    }

    /// A number of trainers: 1 to [`MAX_PEERS`](crate::base::layout::MAX_PEERS), checked here so
    /// the error names the variable it came from.
    fn count(&self, var: &'static str) -> Result<Option<usize>, EnvError> {
        let max = crate::base::layout::MAX_PEERS;
        match self.parse::<usize>(var, "a number of trainers")? {
            Some(0) => Err(EnvError { var, reason: "0 trainers: a job needs at least one".into() }),
            Some(n) if n > max => {
                Err(EnvError { var, reason: format!("{n} trainers, more than {max} (the most a job can have)") })
            }
            n => Ok(n),
        }
    }

    fn flag(&self, var: &'static str) -> Result<Option<bool>, EnvError> {
        match self.text(var).as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => Ok(None),
            Some("1" | "true" | "yes" | "on") => Ok(Some(true)),
            Some("0" | "false" | "no" | "off") => Ok(Some(false)),
            Some(v) => Err(EnvError { var, reason: format!("{v:?} is not a boolean (true/false, 1/0)") }),
        }
    }

    fn role(&self, var: &'static str) -> Result<Option<Role>, EnvError> {
        match self.text(var).as_deref() {
            None => Ok(None),
            Some("PSERVER") => Ok(Some(Role::Pserver)),
            Some("TRAINER") => Ok(Some(Role::Trainer)),
            Some(v) => Err(EnvError { var, reason: format!("{v:?} is not PSERVER or TRAINER") }),
        }
    }

    fn list(&self, var: &'static str) -> Option<Vec<String>> {
        self.text(var).map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
    }
}

fn endpoint(var: &'static str, e: &str) -> Result<String, EnvError> {
    match e.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(e.to_string()),
        _ => Err(EnvError { var, reason: format!("{e:?} is not an ip:port endpoint") }),
    }
}

impl ClusterEnv {
    /// Reads the process environment.
    pub fn from_process() -> Result<ClusterEnv, EnvError> {
        ClusterEnv::read(&|k| std::env::var(k).ok())
    }

    /// `paddle.init(**kwargs)` for oar: the process environment, with each `(name, value)`
    /// argument overriding the variable `PADDLE_INIT_<NAME>` (as `paddle.init(trainer_count=4)`
    /// overrides `PADDLE_INIT_TRAINER_COUNT`). Unknown names are errors.
    pub fn init(args: &[(&str, &str)]) -> Result<ClusterEnv, EnvError> {
        let process = |k: &str| std::env::var(k).ok();
        ClusterEnv::init_with(args, &process)
    }

    /// [`ClusterEnv::init`] over the variables `get` returns.
    pub fn init_with(args: &[(&str, &str)], get: &dyn Fn(&str) -> Option<String>) -> Result<ClusterEnv, EnvError> {
        let mut overrides = Vec::with_capacity(args.len());
        for (name, value) in args {
            let var = format!("PADDLE_INIT_{}", name.to_ascii_uppercase());
            let Some(known) = V2_VARS.iter().find(|v| **v == var) else {
                return Err(EnvError {
                    var: "PADDLE_INIT_*",
                    reason: format!("init argument {name:?} is not one of oar's"),
                });
            };
            overrides.push((*known, value.to_string()));
        }
        ClusterEnv::read(&|k| overrides.iter().find(|(v, _)| *v == k).map(|(_, x)| x.clone()).or_else(|| get(k)))
    }

    /// Reads the variables `get` returns. The first generation present wins: Fleet, then Fluid,
    /// then v2; `OMPI_COMM_WORLD_RANK` gives the trainer id when none of them does.
    pub fn read(get: &dyn Fn(&str) -> Option<String>) -> Result<ClusterEnv, EnvError> {
        let v = Vars { get };
        let mut env = if v.text("TRAINING_ROLE").is_some() || v.text("PADDLE_PSERVERS_IP_PORT_LIST").is_some() {
            fleet(&v)?
        } else if v.text("PADDLE_TRAINING_ROLE").is_some() {
            fluid(&v)?
        } else if v2_present(&v) {
            v2(&v)?
        } else {
            ClusterEnv { contract: Some(Contract::None), ..ClusterEnv::default() }
        };
        if env.trainer_id.is_none() {
            env.trainer_id = v.parse("OMPI_COMM_WORLD_RANK", "a rank (a non-negative integer)")?;
        }
        Ok(env)
    }
}

fn fleet(v: &Vars) -> Result<ClusterEnv, EnvError> {
    let role = v.role("TRAINING_ROLE")?.ok_or(EnvError {
        var: "TRAINING_ROLE",
        reason: "missing (PSERVER or TRAINER; PADDLE_PSERVERS_IP_PORT_LIST is set)".into(),
    })?;
    let list = v.required("PADDLE_PSERVERS_IP_PORT_LIST", "the servers' ip:port list")?;
    let servers = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|e| endpoint("PADDLE_PSERVERS_IP_PORT_LIST", e))
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        // Else `,` alone named no server, and the trainer fell back to training alone.
        return Err(EnvError { var: "PADDLE_PSERVERS_IP_PORT_LIST", reason: format!("{list:?} names no server") });
    }
    let trainers = v
        .count("PADDLE_TRAINERS_NUM")?
        .ok_or(EnvError { var: "PADDLE_TRAINERS_NUM", reason: "missing (the number of trainers)".into() })?;
    let mut env = ClusterEnv {
        contract: Some(Contract::Fleet),
        role: Some(role),
        trainers: Some(trainers),
        port: v.parse("PADDLE_PORT", "a port number")?,
        ..ClusterEnv::default()
    };
    match role {
        Role::Trainer => {
            env.trainer_id = Some(
                v.parse("PADDLE_TRAINER_ID", "a trainer id")?
                    .ok_or(EnvError { var: "PADDLE_TRAINER_ID", reason: "missing (this trainer's id)".into() })?,
            );
        }
        Role::Pserver => {
            let ip = v.required("POD_IP", "a server finds its index by POD_IP:PADDLE_PORT in the server list")?;
            let port = env.port.ok_or(EnvError {
                var: "PADDLE_PORT",
                reason: "missing (a server finds its index by POD_IP:PADDLE_PORT in the server list)".into(),
            })?;
            let me = format!("{ip}:{port}");
            env.server_index = Some(servers.iter().position(|s| *s == me).ok_or(EnvError {
                var: "POD_IP",
                reason: format!("POD_IP:PADDLE_PORT = {me} is not in PADDLE_PSERVERS_IP_PORT_LIST {list}"),
            })?);
            // Listen on POD_IP when it is an address, as PaddlePaddle's servers do; a name (a
            // Kubernetes DNS name that may not resolve yet at start) means every interface.
            if ip.parse::<std::net::IpAddr>().is_ok() {
                env.host = Some(ip.to_string());
            }
        }
    }
    env.servers = Some(servers);
    Ok(env)
}

fn fluid(v: &Vars) -> Result<ClusterEnv, EnvError> {
    let role = v.role("PADDLE_TRAINING_ROLE")?;
    let ips = v
        .list("PADDLE_PSERVER_IPS")
        .ok_or(EnvError { var: "PADDLE_PSERVER_IPS", reason: "missing (the servers' IPs, comma-separated)".into() })?;
    let port: u16 = v
        .parse("PADDLE_PSERVER_PORT", "a port number")?
        .ok_or(EnvError { var: "PADDLE_PSERVER_PORT", reason: "missing (the servers' port)".into() })?;
    let trainers = v
        .count("PADDLE_TRAINERS")?
        .ok_or(EnvError { var: "PADDLE_TRAINERS", reason: "missing (the number of trainers)".into() })?;
    let mut env = ClusterEnv {
        contract: Some(Contract::Fluid),
        role,
        servers: Some(ips.iter().map(|ip| format!("{ip}:{port}")).collect()),
        port: Some(port),
        trainers: Some(trainers),
        ..ClusterEnv::default()
    };
    match role {
        Some(Role::Trainer) => {
            env.trainer_id = Some(
                v.parse("PADDLE_TRAINER_ID", "a trainer id")?
                    .ok_or(EnvError { var: "PADDLE_TRAINER_ID", reason: "missing (this trainer's id)".into() })?,
            );
        }
        _ => {
            let me = v.required("PADDLE_CURRENT_IP", "a server finds its index by its IP in PADDLE_PSERVER_IPS")?;
            env.server_index = Some(ips.iter().position(|ip| *ip == me).ok_or(EnvError {
                var: "PADDLE_CURRENT_IP",
                reason: format!("{me} is not in PADDLE_PSERVER_IPS {}", ips.join(",")),
            })?);
            env.host = Some(me);
        }
    }
    Ok(env)
}

const V2_VARS: [&str; 8] = [
    "PADDLE_INIT_USE_GPU",
    "PADDLE_INIT_TRAINER_COUNT",
    "PADDLE_INIT_PORT",
    "PADDLE_INIT_PORTS_NUM",
    "PADDLE_INIT_PORTS_NUM_FOR_SPARSE",
    "PADDLE_INIT_NUM_GRADIENT_SERVERS",
    "PADDLE_INIT_TRAINER_ID",
    "PADDLE_INIT_PSERVERS",
];

fn v2_present(v: &Vars) -> bool {
    V2_VARS.iter().any(|k| v.text(k).is_some())
}

fn v2(v: &Vars) -> Result<ClusterEnv, EnvError> {
    let port: Option<u16> = v.parse("PADDLE_INIT_PORT", "a port number")?;
    let servers = v
        .list("PADDLE_INIT_PSERVERS")
        .map(|ips| ips.iter().map(|ip| format!("{ip}:{}", port.unwrap_or(DEFAULT_PORT))).collect());
    let count = |var: &'static str| -> Result<Option<usize>, EnvError> { v.parse(var, "a non-negative integer") };
    Ok(ClusterEnv {
        contract: Some(Contract::V2),
        role: None,
        servers,
        server_index: None,
        port,
        host: None,
        trainers: v.count("PADDLE_INIT_NUM_GRADIENT_SERVERS")?,
        trainer_id: count("PADDLE_INIT_TRAINER_ID")?,
        trainer_count: count("PADDLE_INIT_TRAINER_COUNT")?,
        ports_num: count("PADDLE_INIT_PORTS_NUM")?,
        ports_num_for_sparse: count("PADDLE_INIT_PORTS_NUM_FOR_SPARSE")?,
        use_gpu: v.flag("PADDLE_INIT_USE_GPU")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<ClusterEnv, EnvError> {
        let map: std::collections::HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ClusterEnv::read(&|k| map.get(k).cloned())
    }

    #[test]
    fn fleet_servers_find_their_index_and_trainers_their_id() {
        let list = ("PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6170,10.0.0.2:6170");
        let s = read(&[
            ("TRAINING_ROLE", "PSERVER"),
            list,
            ("PADDLE_TRAINERS_NUM", "3"),
            ("POD_IP", "10.0.0.2"),
            ("PADDLE_PORT", "6170"),
        ])
        .unwrap();
        assert_eq!((s.role, s.server_index, s.trainers, s.port), (Some(Role::Pserver), Some(1), Some(3), Some(6170)));
        assert_eq!(s.host.as_deref(), Some("10.0.0.2"), "an address POD_IP is where the server listens");
        let named = read(&[
            ("TRAINING_ROLE", "PSERVER"),
            ("PADDLE_PSERVERS_IP_PORT_LIST", "ps-0.ps:6170"),
            ("PADDLE_TRAINERS_NUM", "1"),
            ("POD_IP", "ps-0.ps"),
            ("PADDLE_PORT", "6170"),
        ])
        .unwrap();
        assert_eq!((named.server_index, named.host), (Some(0), None), "a DNS name: every interface");
        let t = read(&[("TRAINING_ROLE", "TRAINER"), list, ("PADDLE_TRAINERS_NUM", "3"), ("PADDLE_TRAINER_ID", "2")])
            .unwrap();
        assert_eq!((t.role, t.trainer_id), (Some(Role::Trainer), Some(2)));
        assert_eq!(t.servers.unwrap(), ["10.0.0.1:6170", "10.0.0.2:6170"]);
    }

    #[test]
    fn bad_or_missing_variables_are_named() {
        let list = ("PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6170");
        let err = |vars: &[(&str, &str)]| read(vars).unwrap_err().to_string();
        assert!(err(&[("TRAINING_ROLE", "WORKER"), list]).contains("TRAINING_ROLE: \"WORKER\""));
        assert!(err(&[("TRAINING_ROLE", "TRAINER"), list]).contains("PADDLE_TRAINERS_NUM: missing"));
        let e = err(&[("TRAINING_ROLE", "TRAINER"), list, ("PADDLE_TRAINERS_NUM", "two")]);
        assert!(e.contains("PADDLE_TRAINERS_NUM: \"two\" is not"), "{e}");
        // Counts are bounded where they are read, so the error names the variable.
        for (n, want) in
            [("18446744073709551615", "more than 65536"), ("65537", "more than 65536"), ("0", "at least one")]
        {
            let e = err(&[("TRAINING_ROLE", "TRAINER"), list, ("PADDLE_TRAINERS_NUM", n), ("PADDLE_TRAINER_ID", "0")]);
            assert!(e.contains("PADDLE_TRAINERS_NUM: ") && e.contains(want), "{n}: {e}");
            let e = err(&[
                ("PADDLE_TRAINING_ROLE", "TRAINER"),
                ("PADDLE_PSERVER_IPS", "10.0.0.1"),
                ("PADDLE_PSERVER_PORT", "6170"),
                ("PADDLE_TRAINERS", n),
                ("PADDLE_TRAINER_ID", "0"),
            ]);
            assert!(e.contains("PADDLE_TRAINERS: ") && e.contains(want), "{n}: {e}");
        }
        let e = err(&[("TRAINING_ROLE", "TRAINER"), ("PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1")]);
        assert!(e.contains("not an ip:port"), "{e}");
        let e = err(&[("TRAINING_ROLE", "TRAINER"), ("PADDLE_PSERVERS_IP_PORT_LIST", " , ")]);
        assert!(e.contains("names no server"), "{e}");
        let e = err(&[
            ("TRAINING_ROLE", "PSERVER"),
            list,
            ("PADDLE_TRAINERS_NUM", "1"),
            ("POD_IP", "10.9.9.9"),
            ("PADDLE_PORT", "6170"),
        ]);
        assert!(e.contains("10.9.9.9:6170 is not in"), "{e}");
        assert!(err(&[("PADDLE_INIT_USE_GPU", "maybe")]).contains("PADDLE_INIT_USE_GPU"));
        assert!(
            err(&[("PADDLE_TRAINING_ROLE", "TRAINER"), ("PADDLE_PSERVER_IPS", "a")]).contains("PADDLE_PSERVER_PORT")
        );
        assert!(err(&[("OMPI_COMM_WORLD_RANK", "-1")]).contains("OMPI_COMM_WORLD_RANK"));
    }

    #[test]
    fn init_arguments_override_the_environment() {
        let env = |k: &str| match k {
            "PADDLE_INIT_TRAINER_COUNT" => Some("4".to_string()),
            "PADDLE_INIT_TRAINER_ID" => Some("1".to_string()),
            _ => None,
        };
        let e = ClusterEnv::init_with(&[("trainer_count", "2")], &env).unwrap();
        assert_eq!((e.trainer_count, e.trainer_id), (Some(2), Some(1)));
        assert!(ClusterEnv::init_with(&[("gpus", "2")], &env).unwrap_err().to_string().contains("\"gpus\""));
    }

    #[test]
    fn fluid_v2_and_mpi_contracts() {
        let f = read(&[
            ("PADDLE_TRAINING_ROLE", "PSERVER"),
            ("PADDLE_PSERVER_IPS", "10.0.0.1,10.0.0.2"),
            ("PADDLE_PSERVER_PORT", "7164"),
            ("PADDLE_TRAINERS", "2"),
            ("PADDLE_CURRENT_IP", "10.0.0.2"),
        ])
        .unwrap();
        assert_eq!((f.contract, f.server_index, f.port), (Some(Contract::Fluid), Some(1), Some(7164)));
        let v = read(&[
            ("PADDLE_INIT_PSERVERS", "10.0.0.1, 10.0.0.2"),
            ("PADDLE_INIT_TRAINER_COUNT", "4"),
            ("PADDLE_INIT_NUM_GRADIENT_SERVERS", "2"),
            ("PADDLE_INIT_PORTS_NUM_FOR_SPARSE", "1"),
            ("PADDLE_INIT_USE_GPU", "False"),
        ])
        .unwrap();
        assert_eq!(v.servers.unwrap(), ["10.0.0.1:7164", "10.0.0.2:7164"]);
        assert_eq!(
            (v.trainer_count, v.trainers, v.ports_num_for_sparse, v.use_gpu),
            (Some(4), Some(2), Some(1), Some(false))
        );
        assert_eq!(read(&[("OMPI_COMM_WORLD_RANK", "3")]).unwrap().trainer_id, Some(3));
        let explicit = read(&[("PADDLE_INIT_TRAINER_ID", "1"), ("OMPI_COMM_WORLD_RANK", "3")]).unwrap();
        assert_eq!(explicit.trainer_id, Some(1));
    }
}
