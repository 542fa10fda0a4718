//! `oar cluster k8s` manifests checked by a real Kubernetes schema validator, and run as a
//! kubelet would run their pods (init containers, environment, commands) on this host.

use std::path::Path;
use std::process::{Command, Output};

use crate::util::*;

/// The validator from PyPI (`kubernetes-validate`, installed by `.ci/run`), if present.
fn validator() -> Option<String> {
    let found = installed("kubernetes-validate");
    if !found {
        eprintln!("skipped: kubernetes-validate is not installed (.ci/run installs it from PyPI)");
    }
    found.then(|| "kubernetes-validate".to_string())
}

fn validate(validator: &str, file: &Path, version: &str) -> Output {
    Command::new(validator).args(["--strict", "-k", version]).arg(file).output().unwrap()
}

#[test]
fn k8s_manifests_pass_strict_schema_validation() {
    let Some(validator) = validator() else { return };
    let dir = tempfile::tempdir().unwrap();
    let k8s = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_oar"))
            .args(["cluster", "k8s", "--name", "ctr", "--servers", "2", "--workers", "3"])
            .args(["--image", "registry.example/oar:1", "--volume-claim", "oar-data", "--cpus", "2"])
            .args(extra)
            .args(["--", "--mode", "async", "--train", "data/train", "--output", "model"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = k8s(&[]);
    let file = dir.path().join("plain.yaml");
    std::fs::write(&file, &plain).unwrap();
    for version in ["1.28.0", "1.33.0"] {
        let out = validate(&validator, &file, version);
        assert!(out.status.success(), "{}", text(&out));
        // The Secret, the Service, the StatefulSet and the Job.
        assert_eq!(text(&out).matches("passed for resource").count(), 4, "{}", text(&out));
    }
    // The check can fail: a misspelt field is refused.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, plain.replace("parallelism:", "parallelizm:")).unwrap();
    let out = validate(&validator, &broken, "1.28.0");
    assert!(!out.status.success() && text(&out).contains("parallelizm"), "{}", text(&out));

    // The PaddleJob is a custom resource the validator has no schema for: its pod templates
    // are checked strictly as PodTemplates.
    let docs = yaml_docs(k8s(&["--paddlejob"]).as_bytes());
    let job = by_kind(&docs, "PaddleJob").clone();
    let mut docs = String::new();
    for role in ["Master", "Worker"] {
        let spec = &job["spec"]["paddleReplicaSpecs"][role];
        assert_eq!(spec["template"]["spec"]["containers"][0]["name"], "paddle", "the operator's container name");
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": format!("ctr-{}", role.to_lowercase())},
            "template": spec["template"],
        });
        docs.push_str(&format!("---\n{}", serde_yaml_ng::to_string(&pod).unwrap()));
    }
    let file = dir.path().join("paddlejob-pods.yaml");
    std::fs::write(&file, docs).unwrap();
    let out = validate(&validator, &file, "1.28.0");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(text(&out).matches("passed for resource").count(), 2, "{}", text(&out));
}

/// The documents of a multi-document YAML text.
fn yaml_docs(yaml: &[u8]) -> Vec<serde_json::Value> {
    serde_yaml_ng::Deserializer::from_slice(yaml).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

/// The first of `docs` of `kind`.
fn by_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} among the manifests"))
}

/// Mounts the job's Secret as a kubelet would: its data written into a folder of `dir`, and
/// the mount path mapped there (a pair for [`kubelet_env`]'s name mapping).
fn mount_secret(docs: &[serde_json::Value], dir: &Path) -> (String, String) {
    let secret = by_kind(docs, "Secret");
    let folder = dir.join("secret-volume");
    std::fs::create_dir_all(&folder).unwrap();
    // Every key (the master and each trainer's credential) in one folder: the pods' own
    // volumes each select theirs, and each process reads only the file it is given.
    use std::os::unix::fs::PermissionsExt;
    for (key, value) in secret["stringData"].as_object().unwrap() {
        std::fs::write(folder.join(key), value.as_str().unwrap()).unwrap();
        // Mounted as the manifest's defaultMode says: the owner's alone.
        std::fs::set_permissions(folder.join(key), std::fs::Permissions::from_mode(0o400)).unwrap();
    }
    ("/etc/oar-secret".to_string(), folder.display().to_string())
}

/// The environment a kubelet would give one container of `pod` (a pod template spec): plain
/// values, the downward-API fields in `fields`, then `$(VAR)` references to earlier variables
/// expanded, as Kubernetes does; finally every DNS name in `names` replaced by its address.
fn kubelet_env(
    pod: &serde_json::Value,
    fields: &[(&str, String)],
    names: &[(String, String)],
) -> Vec<(String, String)> {
    container_env(&pod["containers"][0], fields, names)
}

/// [`kubelet_env`] of one container.
fn container_env(
    container: &serde_json::Value,
    fields: &[(&str, String)],
    names: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for e in container["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let mut value = match e.get("value") {
            Some(v) => v.as_str().unwrap().to_string(),
            None => {
                let path = e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
                fields.iter().find(|(f, _)| *f == path).unwrap_or_else(|| panic!("no field {path}")).1.clone()
            }
        };
        for (k, v) in &env {
            value = value.replace(&format!("$({k})"), v);
        }
        env.push((name, value));
    }
    for (_, value) in env.iter_mut() {
        for (dns, addr) in names {
            *value = value.replace(dns.as_str(), addr);
        }
    }
    env
}

/// Runs a pod's init containers to completion, as a kubelet does before its container: each
/// command (a shell's) with its own environment, `names` mapping the pod's mounts to folders.
fn run_init(pod: &serde_json::Value, fields: &[(&str, String)], names: &[(String, String)], log: &Path) {
    for init in pod["initContainers"].as_array().into_iter().flatten() {
        let command: Vec<&str> = init["command"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        let env = container_env(init, fields, names);
        let out = Command::new(command[0])
            .args(&command[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        std::fs::write(log, [out.stdout, out.stderr].concat()).unwrap();
        assert!(out.status.success(), "init container {}: see {}", init["name"], log.display());
    }
}

/// Mount mappings of trainer pod `i`: its own memory volume at `/etc/oar-secret` (a folder of
/// `dir`), the trainers' credentials at `/etc/oar-credentials` (the Secret's folder, `secret`
/// as [`mount_secret`] returned it), then the job's `names`.
fn trainer_mounts(
    dir: &Path,
    i: usize,
    secret: &(String, String),
    names: &[(String, String)],
) -> Vec<(String, String)> {
    let own = dir.join(format!("trainer-{i}-memory"));
    std::fs::create_dir_all(&own).unwrap();
    let mut mounts = vec![
        ("/etc/oar-secret".to_string(), own.display().to_string()),
        ("/etc/oar-credentials".to_string(), secret.1.clone()),
    ];
    mounts.extend_from_slice(names);
    mounts
}

/// Starts a pod's container: its command (`oar` -> this binary) with the kubelet's environment.
fn run_pod(pod: &serde_json::Value, env: &[(String, String)], log: &Path, daemons: &mut Daemons, name: &str) {
    let args: Vec<String> =
        pod["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
    let command = pod["containers"][0]["command"].as_array().unwrap();
    assert_eq!(command[0], "oar");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oar"));
    cmd.args(command[1..].iter().map(|c| c.as_str().unwrap())).args(args).env_clear().env("RUST_LOG", "warn");
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    daemons.start(name, &mut cmd, log).unwrap();
}

/// No Kubernetes cluster is available here, so the manifests' own pod specs are run as a
/// kubelet would run them: each pod's environment as the manifest defines it (downward-API
/// fields filled in, `$(VAR)` expanded), its command and arguments; only the cluster DNS names
/// are mapped to loopback addresses (one per pod, 127.0.0.2 ...). Plain manifests and the
/// PaddleJob both train 2 servers x 2 trainers to a saved model that way.
#[test]
fn k8s_manifests_configure_a_working_job_when_their_pods_are_emulated() {
    for paddlejob in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (train, _) = gen_data(d, 2, 1500, 0);
        let model = d.join("model");
        let port = free_ports(1).to_string();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oar"));
        cmd.args([
            "cluster",
            "k8s",
            "--name",
            "emu",
            "--servers",
            "2",
            "--workers",
            "2",
            "--image",
            "x",
            "--port",
            &port,
        ]);
        if paddlejob {
            cmd.arg("--paddlejob");
        }
        cmd.args(["--", "--mode", "async", "--hidden", "16", "--batch-size", "200", "--timeout", "60"]);
        let out = cmd.arg("--train").arg(&train).arg("--output").arg(&model).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let docs = yaml_docs(&out.stdout);
        let (server_pod, trainer_pod, server_name): (_, _, fn(usize) -> String) = if paddlejob {
            let spec = &by_kind(&docs, "PaddleJob")["spec"]["paddleReplicaSpecs"];
            (spec["Master"]["template"]["spec"].clone(), spec["Worker"]["template"]["spec"].clone(), |i| {
                format!("emu-master-{i}")
            })
        } else {
            let (servers, trainers) = (by_kind(&docs, "StatefulSet"), by_kind(&docs, "Job"));
            (servers["spec"]["template"]["spec"].clone(), trainers["spec"]["template"]["spec"].clone(), |i| {
                format!("emu-ps-{i}.emu-ps")
            })
        };
        // Longest names first, so `emu-ps-1.emu-ps` is mapped before any shorter prefix.
        let mut names: Vec<(String, String)> =
            (0..2).rev().map(|i| (server_name(i), format!("127.0.0.{}", i + 2))).collect();
        let secret = mount_secret(&docs, d);
        names.push(secret.clone());
        let mut pods = Daemons::default();
        for i in 0..2 {
            let fields = [
                ("metadata.name", format!("emu-ps-{i}")),
                ("metadata.labels['training.kubeflow.org/replica-index']", i.to_string()),
            ];
            let env = kubelet_env(&server_pod, &fields, &names);
            run_pod(&server_pod, &env, &d.join(format!("server.{i}.log")), &mut pods, &format!("server {i}"));
        }
        let trainers: Vec<_> = (0..2)
            .map(|i| {
                let fields = [
                    ("metadata.annotations['batch.kubernetes.io/job-completion-index']", i.to_string()),
                    ("metadata.labels['training.kubeflow.org/replica-index']", i.to_string()),
                ];
                let mounts = trainer_mounts(d, i, &secret, &names);
                run_init(&trainer_pod, &fields, &mounts, &d.join(format!("trainer.{i}.init.log")));
                let env = kubelet_env(&trainer_pod, &fields, &mounts);
                let mut trainer = Daemons::default();
                run_pod(&trainer_pod, &env, &d.join(format!("trainer.{i}.log")), &mut trainer, &format!("trainer {i}"));
                trainer
            })
            .collect();
        for (i, mut t) in trainers.into_iter().enumerate() {
            let status = t.0[0].1.wait().unwrap();
            let log = std::fs::read_to_string(d.join(format!("trainer.{i}.log"))).unwrap();
            assert!(status.success(), "paddlejob={paddlejob} trainer {i}:\n{log}");
            assert!(log.contains("trained 1500 samples"), "{log}");
            // Its own credential, picked by its index from the trainers' ones it mounts.
            assert!(!log.contains("master secret"), "{log}");
        }
        if paddlejob {
            // PaddleJob servers exit when the trainers are done (completing the job).
            for (name, server) in &mut pods.0 {
                assert!(server.wait().unwrap().success(), "{name}");
            }
        }
        // Plain servers keep serving (a StatefulSet would restart them) but saved the model
        // when the last trainer closed: written before that close was answered.
        let manifest = std::fs::read_to_string(model.join("final/manifest.json")).unwrap();
        assert!(manifest.contains("\"num_servers\": 2"), "paddlejob={paddlejob}: {manifest}");
    }
}

/// With --max-restarts every pod is --recoverable, and a container that fails is started again
/// with the same command and environment (restartPolicy Always for servers, OnFailure for
/// trainers), as emulated here: server 1 killed mid-run (`OAR_FAULT`, which fires in a first
/// life only) comes back under the next epoch from its checkpoint folder, trainer 1 killed
/// mid-pass rejoins from its recorded position, and the job ends with every sample trained and
/// the model saved.
#[test]
fn k8s_containers_restarted_by_their_policy_go_on_where_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (train, _) = gen_data(d, 2, 3000, 0);
    let model = d.join("model");
    let port = free_ports(1).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["cluster", "k8s", "--name", "emu", "--servers", "2", "--workers", "2", "--image", "x"])
        .args(["--port", &port, "--volume-claim", "data", "--max-restarts", "2", "--"])
        .args(["--mode", "async", "--hidden", "16", "--batch-size", "100", "--passes", "2", "--timeout", "60"])
        .args(["--checkpoint-every", "0.2", "--train"])
        .arg(&train)
        .arg("--output")
        .arg(&model)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let docs = yaml_docs(&out.stdout);
    let server_pod = &by_kind(&docs, "StatefulSet")["spec"]["template"]["spec"];
    let trainer_pod = &by_kind(&docs, "Job")["spec"]["template"]["spec"];
    assert_eq!((&server_pod["restartPolicy"], &trainer_pod["restartPolicy"]), (&"Always".into(), &"OnFailure".into()));
    let mut names: Vec<(String, String)> =
        (0..2).rev().map(|i| (format!("emu-ps-{i}.emu-ps"), format!("127.0.0.{}", i + 2))).collect();
    let secret = mount_secret(&docs, dir.path());
    names.push(secret.clone());
    // (pod spec, environment, name, whether it must end) of each pod; faults for the pods of index 1.
    let mut pods = Vec::new();
    for i in 0..2 {
        let mut env = kubelet_env(server_pod, &[("metadata.name", format!("emu-ps-{i}"))], &names);
        let fields = [("metadata.annotations['batch.kubernetes.io/job-completion-index']", i.to_string())];
        let mounts = trainer_mounts(d, i, &secret, &names);
        run_init(trainer_pod, &fields, &mounts, &d.join(format!("trainer.{i}.init.log")));
        let mut trainer_env = kubelet_env(trainer_pod, &fields, &mounts);
        if i == 1 {
            env.push(("OAR_FAULT".into(), "server1:kill@version=70".into()));
            trainer_env.push(("OAR_FAULT".into(), "trainer1:kill@step=25".into()));
        }
        pods.push((server_pod, env, format!("server.{i}"), false));
        pods.push((trainer_pod, trainer_env, format!("trainer.{i}"), true));
    }
    // The kubelet: start every container, start a failed one again (its log per life).
    let mut running: Vec<(Daemons, u32)> = pods
        .iter()
        .map(|(pod, env, name, _)| {
            let mut c = Daemons::default();
            run_pod(pod, env, &d.join(format!("{name}.log")), &mut c, name);
            (c, 0)
        })
        .collect();
    let mut ended = [false; 4];
    wait_until(180, "both trainers to end", || {
        for (k, (pod, env, name, must_end)) in pods.iter().enumerate() {
            let (container, lives) = &mut running[k];
            let Some(status) = container.0[0].1.try_wait().unwrap() else { continue };
            if status.success() && *must_end {
                ended[k] = true;
                continue;
            }
            assert!(*lives < 2, "{name} failed again ({status}): see {}", d.display());
            *lives += 1;
            let mut c = Daemons::default();
            run_pod(pod, env, &d.join(format!("{name}.restart-{lives}.log")), &mut c, name);
            container.0 = std::mem::take(&mut c.0);
        }
        ended[1] && ended[3]
    });
    let lives: Vec<u32> = running.iter().map(|r| r.1).collect();
    assert_eq!(lives, [0, 0, 1, 1], "server 1 and trainer 1 restarted once each (order: s0 t0 s1 t1)");
    let server = std::fs::read_to_string(d.join("server.1.restart-1.log")).unwrap();
    assert!(server.contains("going on from it") && server.contains("epoch=1"), "{server}");
    let trainer = std::fs::read_to_string(d.join("trainer.1.restart-1.log")).unwrap();
    assert!(trainer.contains("rejoining: going on after the last recorded step"), "{trainer}");
    for log in ["trainer.0.log", "trainer.1.restart-1.log"] {
        let log = std::fs::read_to_string(d.join(log)).unwrap();
        assert!(log.contains("trained 6000 samples"), "{log}");
    }
    let manifest = std::fs::read_to_string(model.join("final/manifest.json")).unwrap();
    assert!(manifest.contains("\"num_servers\": 2"), "{manifest}");
}

/// Fields Kubernetes would refuse on apply (after the Secret and Service were created, leaving
/// half a job) are refused when rendering, naming the flag; all were printed, exit 0.
#[test]
fn k8s_fields_kubernetes_would_refuse_are_refused_naming_the_flag() {
    let base = ["cluster", "k8s", "--name", "ctr", "--servers", "1", "--workers", "1"];
    let cases: [(&[&str], &str); 4] = [
        (&["--image", "img", "--port", "0"], "--port 0"),
        (&["--image", "img\nkind: Pod"], "--image"),
        (&["--image", "img", "--cpus", "abc"], "--cpus \"abc\""),
        (&["--image", "img", "--volume-claim", "Bad Claim;$(id)", "--mount-path", "/w"], "--volume-claim"),
    ];
    for (args, want) in cases {
        let o = oar(&[&base[..], args, &["--", "--train", "x"]].concat());
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
}
