//! `oar cluster k8s`: Kubernetes manifests for a job, configured through PaddlePaddle's Fleet
//! variables (`TRAINING_ROLE`, `PADDLE_PSERVERS_IP_PORT_LIST`, `PADDLE_TRAINERS_NUM`,
//! `PADDLE_TRAINER_ID`, `POD_IP` + `PADDLE_PORT`), so every pod runs the same `oar train`
//! command line and needs no rendezvous.
//!
//! Plain Kubernetes (no operator): a headless Service that gives servers stable names
//! (`<job>-ps-<i>.<job>-ps`, resolvable before readiness), a server StatefulSet whose pods find
//! their index by matching `POD_IP` (set to that name) in the server list, and an Indexed Job
//! of trainers whose id is the completion index. Servers keep serving after the trainers are
//! done (a StatefulSet restarts pods that exit) and save the model when the last trainer closes.
//!
//! With `paddlejob`, a Kubeflow training-operator `PaddleJob` (`kubeflow.org/v1`) instead:
//! `Master` replicas are the servers and `Worker` replicas the trainers (its parameter-server
//! mode); the operator gives every replica a Service named `<job>-master-<i>` /
//! `<job>-worker-<i>` and labels it with its index, which the env turns into Fleet variables.
//! Servers exit once the trainers are done, which completes the PaddleJob.
//!
//! The manifests are built as JSON values and rendered to YAML by `serde_yaml_ng`, the
//! maintained fork of serde_yaml. With `--max-restarts N` Kubernetes restarts failed containers
//! (server containers always, trainer containers up to N times), and every process is
//! `--recoverable`: it works out from the shared volume what it is. A job's secret goes into a
//! Kubernetes Secret: server pods mount the master, each trainer pod only its own credential.

use serde_json::{json, Value};

/// What to generate.
#[derive(Clone, Debug)]
pub struct K8sConfig {
    /// Job name: a DNS-1035 label (lower-case letters, digits, '-').
    pub name: String,
    /// Number of servers.
    pub servers: usize,
    /// Number of trainers.
    pub workers: usize,
    /// Container image holding `oar`.
    pub image: String,
    /// Servers' port.
    pub port: u16,
    /// Arguments of `oar train` after the command, for every pod.
    pub train_args: Vec<String>,
    /// A PersistentVolumeClaim mounted in every pod (data and model).
    pub volume_claim: Option<String>,
    /// Where the claim is mounted.
    pub mount_path: String,
    /// CPU request and limit of each pod (e.g. "2").
    pub cpus: Option<String>,
    /// Generate a Kubeflow PaddleJob instead of the plain manifests.
    pub paddlejob: bool,
    /// Failed trainer containers are restarted this many times at most (server containers
    /// always are), every process `--recoverable`; 0: a failure fails the job.
    pub max_restarts: usize,
    /// The job's master secret: put in a Kubernetes Secret (`NAME-secret`, applied first)
    /// beside each trainer's credential derived from it (`trainer-<i>`). Server pods mount the
    /// master alone; a trainer pod's init container copies the pod's own credential into a
    /// memory volume, the only secret its `oar train` sees (`OAR_SECRET_FILE`).
    pub secret: Option<crate::security::auth::Secret>,
}

/// Where a process's own secret file (`secret`) is mounted: the master for a server, its own
/// credential for a trainer.
const SECRET_MOUNT: &str = "/etc/oar-secret";
/// Where a trainer pod's init container mounts the trainers' credentials.
const CREDENTIALS_MOUNT: &str = "/etc/oar-credentials";
/// The init container's copy of its pod's credential (no `$(`: Kubernetes would expand it).
const COPY_OWN_CREDENTIAL: &str =
    r#"cp "$FROM/trainer-$PADDLE_TRAINER_ID" "$TO.part" && chmod 400 "$TO.part" && mv -f "$TO.part" "$TO""#;

/// Checks the name is a DNS-1035 label Kubernetes accepts for every object derived from it.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    anyhow::ensure!(
        ok,
        "--name {name:?}: use 1-40 lower-case letters, digits and '-', starting with a letter (a DNS-1035 label)"
    );
    Ok(())
}

/// Checks what goes into the manifests as Kubernetes checks it when they are applied: one it
/// refuses after the Secret and Service were created leaves half a job behind.
fn check_fields(c: &K8sConfig) -> anyhow::Result<()> {
    anyhow::ensure!(c.port >= 1, "--port 0: a container port is 1 to 65535");
    anyhow::ensure!(
        !c.image.is_empty() && !c.image.chars().any(|ch| ch.is_whitespace() || ch.is_control()),
        "--image {:?}: an image reference has no spaces or line breaks",
        c.image
    );
    if let Some(cpus) = &c.cpus {
        // A quantity as Kubernetes writes CPUs: `2`, `0.5`, `500m`.
        let digits = cpus.strip_suffix('m').unwrap_or(cpus);
        let (whole, frac) = digits.split_once('.').unwrap_or((digits, "0"));
        let number = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        anyhow::ensure!(
            number(whole) && number(frac) && cpus.len() <= 20,
            "--cpus {cpus:?}: a CPU quantity such as 2, 0.5 or 500m"
        );
    }
    if let Some(claim) = &c.volume_claim {
        let ok = (1..=253).contains(&claim.len())
            && claim.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && claim.starts_with(|ch: char| ch.is_ascii_alphanumeric())
            && claim.ends_with(|ch: char| ch.is_ascii_alphanumeric());
        anyhow::ensure!(ok, "--volume-claim {claim:?}: a claim's name is lower-case letters, digits, '-' and '.'");
    }
    anyhow::ensure!(
        c.mount_path.starts_with('/') && !c.mount_path.contains(':') && !c.mount_path.chars().any(char::is_control),
        "--mount-path {:?}: an absolute path without ':'",
        c.mount_path
    );
    anyhow::ensure!(
        c.max_restarts <= i32::MAX as usize,
        "--max-restarts {}: at most {} (a Job's backoffLimit is a 32-bit number)",
        c.max_restarts,
        i32::MAX
    );
    Ok(())
}

fn env(name: &str, value: impl ToString) -> Value {
    json!({"name": name, "value": value.to_string()})
}

fn env_from(name: &str, field: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}})
}

/// A pod spec running `oar train` with `env`.
fn pod_spec(c: &K8sConfig, container: &str, env: Vec<Value>, restart: &str, server: bool) -> Value {
    let mut container = json!({
        "name": container,
        "image": c.image,
        "command": ["oar", "train"],
        "args": c.train_args,
        "env": env,
    });
    if server {
        container["ports"] = json!([{"name": if c.paddlejob { "master" } else { "ps" }, "containerPort": c.port}]);
        container["readinessProbe"] = json!({"tcpSocket": {"port": c.port}, "periodSeconds": 5});
    }
    if let Some(cpus) = &c.cpus {
        container["resources"] = json!({"requests": {"cpu": cpus}, "limits": {"cpu": cpus}});
    }
    let mut spec = json!({"restartPolicy": restart, "containers": [container]});
    let (mut mounts, mut volumes) = (Vec::new(), Vec::new());
    if let Some(claim) = &c.volume_claim {
        mounts.push(json!({"name": "work", "mountPath": c.mount_path}));
        spec["containers"][0]["workingDir"] = json!(c.mount_path);
        volumes.push(json!({"name": "work", "persistentVolumeClaim": {"claimName": claim}}));
    }
    if c.secret.is_some() {
        mounts.push(json!({"name": "secret", "mountPath": SECRET_MOUNT, "readOnly": true}));
        let secret_name = format!("{}-secret", c.name);
        if server {
            let items = [json!({"key": "secret", "path": "secret"})];
            let master = json!({"secretName": secret_name, "defaultMode": 0o400, "items": items});
            volumes.push(json!({"name": "secret", "secret": master}));
        } else {
            // A pod template is shared by every replica of its role: an init container, which
            // alone mounts the trainers' credentials, copies this pod's own into a memory
            // volume, the only one `oar train` sees.
            let key = |i: usize| json!({"key": format!("trainer-{i}"), "path": format!("trainer-{i}")});
            let items: Vec<Value> = (0..c.workers).map(key).collect();
            let credentials = json!({"secretName": secret_name, "defaultMode": 0o400, "items": items});
            volumes.push(json!({"name": "secret", "emptyDir": {"medium": "Memory"}}));
            volumes.push(json!({"name": "credentials", "secret": credentials}));
            // The init container picks this pod's credential by the same trainer id.
            let id = env.iter().find(|v| v["name"] == "PADDLE_TRAINER_ID").cloned();
            let paths = [
                json!({"name": "FROM", "value": CREDENTIALS_MOUNT}),
                json!({"name": "TO", "value": format!("{SECRET_MOUNT}/secret")}),
            ];
            let copy = json!({
                "name": "credential",
                "image": c.image,
                "command": ["sh", "-c", COPY_OWN_CREDENTIAL],
                "env": id.into_iter().chain(paths).collect::<Vec<_>>(),
                "volumeMounts": [
                    {"name": "credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": true},
                    {"name": "secret", "mountPath": SECRET_MOUNT},
                ],
            });
            spec["initContainers"] = json!([copy]);
        }
    }
    if !mounts.is_empty() {
        spec["containers"][0]["volumeMounts"] = json!(mounts);
        spec["volumes"] = json!(volumes);
    }
    spec
}

/// The manifests, as Kubernetes objects in apply order.
pub fn manifests(c: &K8sConfig) -> anyhow::Result<Vec<Value>> {
    check_name(&c.name)?;
    check_fields(c)?;
    anyhow::ensure!(c.servers >= 1 && c.workers >= 1, "--servers and --workers must be at least 1");
    let max = crate::base::layout::MAX_PEERS;
    anyhow::ensure!(c.servers <= max && c.workers <= max, "--servers and --workers must be at most {max}");
    anyhow::ensure!(
        c.max_restarts == 0 || c.volume_claim.is_some(),
        "--max-restarts needs --volume-claim: a restarted container goes on from the checkpoints and \
         positions on it (a container's own files do not survive its restart)"
    );
    let restartable = c.max_restarts > 0;
    let name = &c.name;
    let svc = format!("{name}-ps");
    // Servers' names: the operator's per-replica Services, or the StatefulSet's pods.
    let server_name = |i: usize| if c.paddlejob { format!("{name}-master-{i}") } else { format!("{svc}-{i}.{svc}") };
    let list: Vec<String> = (0..c.servers).map(|i| format!("{}:{}", server_name(i), c.port)).collect();
    let common = |role: &str| {
        let mut vars = vec![
            env("TRAINING_ROLE", role),
            env("PADDLE_TRAINERS_NUM", c.workers),
            env("PADDLE_PORT", c.port),
            env("OAR_JOB", name),
            env("PADDLE_PSERVERS_IP_PORT_LIST", list.join(",")),
        ];
        if restartable {
            vars.push(env("OAR_RECOVERABLE", "true"));
        }
        vars
    };
    let secret_file = |vars: &mut Vec<Value>| {
        if c.secret.is_some() {
            vars.push(env("OAR_SECRET_FILE", format!("{SECRET_MOUNT}/secret")));
        }
    };
    // The Secret comes first: pods that mount it cannot start before it exists.
    let secret = match &c.secret {
        Some(master) => {
            let mut data = serde_json::Map::new();
            data.insert("secret".into(), json!(String::from_utf8_lossy(&master.bytes())));
            for i in 0..c.workers {
                let own = master.derive(name, crate::security::auth::Identity::Trainer(i as u64))?;
                data.insert(format!("trainer-{i}"), json!(String::from_utf8_lossy(&own.bytes())));
            }
            Some(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": format!("{name}-secret")},
                "type": "Opaque",
                "stringData": data,
            }))
        }
        None => None,
    };
    let restart_policy = if restartable { "OnFailure" } else { "Never" };
    if c.paddlejob {
        let index = "metadata.labels['training.kubeflow.org/replica-index']";
        let mut server_env = common("PSERVER");
        server_env.push(env_from("REPLICA_INDEX", index));
        server_env.push(env("POD_IP", format!("{name}-master-$(REPLICA_INDEX)")));
        secret_file(&mut server_env);
        let mut trainer_env = common("TRAINER");
        trainer_env.push(env_from("PADDLE_TRAINER_ID", index));
        secret_file(&mut trainer_env);
        let replica = |replicas: usize, spec: Value| json!({"replicas": replicas, "restartPolicy": restart_policy, "template": {"spec": spec}});
        let mut run_policy = json!({"cleanPodPolicy": "None"});
        if restartable {
            run_policy["backoffLimit"] = json!(c.max_restarts);
        }
        return Ok(secret
            .into_iter()
            .chain([json!({
                "apiVersion": "kubeflow.org/v1",
                "kind": "PaddleJob",
                "metadata": {"name": name},
                "spec": {
                    "runPolicy": run_policy,
                    "paddleReplicaSpecs": {
                        "Master": replica(c.servers, pod_spec(c, "paddle", server_env, restart_policy, true)),
                        "Worker": replica(c.workers, pod_spec(c, "paddle", trainer_env, restart_policy, false)),
                    }
                }
            })])
            .collect());
    }
    let labels = |role: &str| json!({"app": name, "role": role});
    let mut server_env = common("PSERVER");
    server_env.push(env_from("POD_NAME", "metadata.name"));
    // Dependent expansion: the server's own name in the list, which is how it finds its index.
    server_env.push(env("POD_IP", format!("$(POD_NAME).{svc}")));
    server_env.push(env("OAR_KEEP_SERVING", "true"));
    secret_file(&mut server_env);
    let mut trainer_env = common("TRAINER");
    trainer_env.push(env_from("PADDLE_TRAINER_ID", "metadata.annotations['batch.kubernetes.io/job-completion-index']"));
    secret_file(&mut trainer_env);
    Ok(secret
        .into_iter()
        .chain([
            json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": svc, "labels": labels("pserver")},
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": true,
                    "selector": labels("pserver"),
                    "ports": [{"name": "ps", "port": c.port}],
                }
            }),
            json!({
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": svc, "labels": labels("pserver")},
                "spec": {
                    "serviceName": svc,
                    "replicas": c.servers,
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": labels("pserver")},
                    "template": {
                        "metadata": {"labels": labels("pserver")},
                        "spec": pod_spec(c, "oar", server_env, "Always", true),
                    }
                }
            }),
            json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": format!("{name}-trainer"), "labels": labels("trainer")},
                "spec": {
                    "completionMode": "Indexed",
                    "completions": c.workers,
                    "parallelism": c.workers,
                    "backoffLimit": c.max_restarts,
                    "template": {
                        "metadata": {"labels": labels("trainer")},
                        "spec": pod_spec(c, "oar", trainer_env, restart_policy, false),
                    }
                }
            }),
        ])
        .collect())
}

/// The manifests as one multi-document YAML text.
pub fn render(c: &K8sConfig) -> anyhow::Result<String> {
    let mut out = String::new();
    for m in manifests(c)? {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&m)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> K8sConfig {
        K8sConfig {
            name: "ctr".into(),
            servers: 2,
            workers: 3,
            image: "registry.example/oar:1".into(),
            port: 7164,
            train_args: vec!["--train".into(), "data/train".into()],
            volume_claim: None,
            mount_path: "/oar".into(),
            cpus: None,
            paddlejob: false,
            max_restarts: 0,
            secret: None,
        }
    }

    #[test]
    fn fields_kubernetes_would_refuse_are_refused_when_rendering() {
        let claim = |c: &str| K8sConfig { volume_claim: Some(c.into()), max_restarts: 1, ..config() };
        let ok = [
            K8sConfig { cpus: Some("500m".into()), ..config() },
            K8sConfig { cpus: Some("0.5".into()), ..config() },
            claim("data.claim-1"),
        ];
        for c in ok {
            manifests(&c).unwrap();
        }
        let bad = [
            (K8sConfig { port: 0, ..config() }, "--port 0"),
            (K8sConfig { image: "img\nkind: Pod".into(), ..config() }, "--image"),
            (K8sConfig { image: String::new(), ..config() }, "--image"),
            (K8sConfig { cpus: Some("abc".into()), ..config() }, "--cpus \"abc\""),
            (K8sConfig { cpus: Some("1.".into()), ..config() }, "--cpus"),
            (claim("Bad Claim;$(id)"), "--volume-claim"),
            (claim("-x"), "--volume-claim"),
            (K8sConfig { mount_path: "rel:path".into(), ..config() }, "--mount-path"),
            (K8sConfig { max_restarts: usize::MAX, ..claim("c") }, "at most 2147483647"),
        ];
        for (c, want) in bad {
            let e = manifests(&c).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn the_secret_is_a_kubernetes_secret_applied_first_and_mounted_into_every_pod() {
        for paddlejob in [false, true] {
            let secret = crate::security::auth::Secret::generate();
            let m = manifests(&K8sConfig { paddlejob, secret: Some(secret.clone()), ..config() }).unwrap();
            assert_eq!(
                (m[0]["kind"].as_str(), m[0]["metadata"]["name"].as_str()),
                (Some("Secret"), Some("ctr-secret"))
            );
            assert_eq!(m[0]["stringData"]["secret"].as_str().unwrap().as_bytes(), secret.bytes());
            let text = serde_json::to_string(&m[1..]).unwrap();
            assert!(!text.contains(std::str::from_utf8(&secret.bytes()).unwrap()), "only the Secret holds it");
            let pods: Vec<&Value> = if paddlejob {
                let spec = &m[1]["spec"]["paddleReplicaSpecs"];
                vec![&spec["Master"]["template"]["spec"], &spec["Worker"]["template"]["spec"]]
            } else {
                vec![&m[2]["spec"]["template"]["spec"], &m[3]["spec"]["template"]["spec"]]
            };
            // Servers read the master; trainers their own credential, derived for this job.
            let trainer_1: crate::security::auth::Secret = {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("trainer-1");
                std::fs::write(&file, m[0]["stringData"]["trainer-1"].as_str().unwrap()).unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
                crate::security::auth::Secret::read(&file).unwrap()
            };
            assert_eq!(
                (trainer_1.identity(), trainer_1.job()),
                (crate::security::auth::Identity::Trainer(1), Some("ctr"))
            );
            let keys = |volume: &Value| -> Vec<String> {
                assert_eq!(volume["secret"]["secretName"], "ctr-secret");
                volume["secret"]["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i["key"].as_str().unwrap().into())
                    .collect()
            };
            for pod in &pods {
                assert!(env_of(pod).contains(&("OAR_SECRET_FILE".into(), "/etc/oar-secret/secret".into())));
                let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
                assert_eq!((&mounts[0]["name"], &mounts[0]["readOnly"]), (&json!("secret"), &json!(true)));
                assert_eq!(mounts.len(), 1, "no other secret");
            }
            // The server's own volume holds the master alone.
            assert_eq!(keys(&pods[0]["volumes"][0]), ["secret"]);
            assert!(pods[0].get("initContainers").is_none());
            // A trainer's is a memory volume its init container fills from the trainers' credentials.
            assert_eq!(pods[1]["volumes"][0]["emptyDir"]["medium"], "Memory");
            assert_eq!(keys(&pods[1]["volumes"][1]), ["trainer-0", "trainer-1", "trainer-2"]);
            let init = &pods[1]["initContainers"][0];
            let mounts: Vec<&str> =
                init["volumeMounts"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
            assert_eq!(mounts, ["credentials", "secret"]);
            assert!(env_of_container(init).iter().any(|(k, _)| k == "PADDLE_TRAINER_ID"));
        }
    }

    fn env_of(pod: &Value) -> Vec<(String, String)> {
        env_of_container(&pod["containers"][0])
    }

    fn env_of_container(container: &Value) -> Vec<(String, String)> {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let v = e.get("value").map(|v| v.as_str().unwrap().to_string());
                (e["name"].as_str().unwrap().to_string(), v.unwrap_or_else(|| e["valueFrom"].to_string()))
            })
            .collect()
    }

    #[test]
    fn servers_find_their_name_in_the_list_and_trainers_their_index() {
        let m = manifests(&config()).unwrap();
        let kinds: Vec<_> = m.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Service", "StatefulSet", "Job"]);
        let server = env_of(&m[1]["spec"]["template"]["spec"]);
        let get = |e: &[(String, String)], k: &str| e.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get(&server, "PADDLE_PSERVERS_IP_PORT_LIST"), "ctr-ps-0.ctr-ps:7164,ctr-ps-1.ctr-ps:7164");
        assert_eq!(get(&server, "POD_IP"), "$(POD_NAME).ctr-ps");
        let trainer = env_of(&m[2]["spec"]["template"]["spec"]);
        assert!(get(&trainer, "PADDLE_TRAINER_ID").contains("job-completion-index"));
        assert_eq!(get(&trainer, "PADDLE_TRAINERS_NUM"), "3");
        // The pod names the StatefulSet gives are the list's names.
        assert_eq!(m[1]["metadata"]["name"], m[0]["metadata"]["name"]);
    }

    #[test]
    fn a_paddlejob_maps_masters_to_servers_and_workers_to_trainers() {
        let m = manifests(&K8sConfig { paddlejob: true, ..config() }).unwrap();
        let spec = &m[0]["spec"]["paddleReplicaSpecs"];
        assert_eq!(spec["Master"]["replicas"], 2);
        assert_eq!(spec["Worker"]["replicas"], 3);
        let master = &spec["Master"]["template"]["spec"]["containers"][0];
        assert_eq!(master["name"], "paddle");
        assert_eq!(master["ports"][0]["name"], "master");
        let server = env_of(&spec["Master"]["template"]["spec"]);
        assert!(server.contains(&("POD_IP".into(), "ctr-master-$(REPLICA_INDEX)".into())));
        assert!(server.contains(&("PADDLE_PSERVERS_IP_PORT_LIST".into(), "ctr-master-0:7164,ctr-master-1:7164".into())));
    }

    #[test]
    fn restarts_make_every_pod_recoverable_and_need_a_volume() {
        let err = manifests(&K8sConfig { max_restarts: 2, ..config() }).unwrap_err().to_string();
        assert!(err.contains("--max-restarts needs --volume-claim"), "{err}");
        let c = K8sConfig { max_restarts: 2, volume_claim: Some("data".into()), ..config() };
        let m = manifests(&c).unwrap();
        let (servers, trainers) = (&m[1]["spec"]["template"]["spec"], &m[2]["spec"]["template"]["spec"]);
        assert_eq!(servers["restartPolicy"], "Always");
        assert_eq!((&trainers["restartPolicy"], &m[2]["spec"]["backoffLimit"]), (&json!("OnFailure"), &json!(2)));
        for pod in [servers, trainers] {
            assert!(env_of(pod).contains(&("OAR_RECOVERABLE".into(), "true".into())));
        }
        let job = &manifests(&K8sConfig { paddlejob: true, ..c }).unwrap()[0]["spec"];
        assert_eq!(job["runPolicy"]["backoffLimit"], 2);
        for role in ["Master", "Worker"] {
            assert_eq!(job["paddleReplicaSpecs"][role]["restartPolicy"], "OnFailure");
        }
        // Without restarts a failure fails the job.
        let m = manifests(&config()).unwrap();
        assert_eq!(
            (&m[2]["spec"]["template"]["spec"]["restartPolicy"], &m[2]["spec"]["backoffLimit"]),
            (&json!("Never"), &json!(0))
        );
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in ["", "Ctr", "1ctr", "ctr-", "c_tr"] {
            assert!(manifests(&K8sConfig { name: bad.into(), ..config() }).is_err(), "{bad}");
        }
    }
}
