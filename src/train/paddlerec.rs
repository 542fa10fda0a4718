//! PaddleRec's `config.yaml` read as an oar job, for the rank models oar's zoo has: `dnn`
//! (PaddleRec's `models/rank/dnn`: the slots embedded, concatenated with the dense values, an
//! MLP), `wide_deep` and `deepfm`, over the Criteo slot lines PaddleRec's readers read
//! (`click:0 dense_feature:0.1 .. 1:737395 ..`), which oar reads as they are.
//!
//! Pure: the text in, the job, the run's settings (`runner.*`) and every key left out (with
//! why) out. `oar train|launch --paddlerec-config FILE` and Python's `oar.paddlerec.load` both
//! read configs here.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::job_config::JobConfig;
use crate::protocol::Mode;

/// The models read, by PaddleRec's folder name (`models/rank/NAME/config.yaml`).
pub const MODELS: [&str; 3] = ["dnn", "wide_deep", "deepfm"];

/// A PaddleRec config as an oar job.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddleRecJob {
    /// The job: the model `hyper_parameters` describe, its optimizer, the slot data format.
    pub job: JobConfig,
    /// `runner.train_data_dir`, resolved against the config's folder.
    pub train: Option<PathBuf>,
    /// `runner.test_data_dir`, resolved likewise.
    pub test: Option<PathBuf>,
    /// `runner.model_save_path`, resolved likewise.
    pub output: Option<PathBuf>,
    /// `runner.sync_mode`.
    pub mode: Option<Mode>,
    /// The keys not used, each with the reason, in the config's order.
    pub unused: Vec<(String, String)>,
}

/// Why a `runner` key has no part in an oar job.
fn ignored(key: &str) -> &'static str {
    match key {
        "train_reader_path" | "infer_reader_path" | "reader_type" => "oar reads PaddleRec's slot lines itself",
        "use_gpu" => "oar trains on CPUs",
        "use_auc" => "oar always reports AUC",
        "infer_batch_size" | "infer_load_path" | "infer_start_epoch" | "infer_end_epoch" => {
            "inference is oar predict/serve"
        }
        "use_inference" | "save_inference_feed_varnames" | "save_inference_fetch_varnames" => "oar export writes ONNX",
        "num_workers" => "oar's readers are threads of their own",
        "split_file_list" => "oar shares files among trainers itself",
        "use_fleet" => "oar is the parameter server",
        _ => "not read by oar",
    }
}

/// Reads the PaddleRec config file at `path` (at most a job file's size, UTF-8); see [`read`].
pub fn from_file(path: &Path, model: Option<&str>) -> anyhow::Result<PaddleRecJob> {
    let bytes = crate::base::state_file::read_named(path, super::job_config::MAX_JOB_FILE_BYTES)?;
    let text = String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{}: not UTF-8 text: {e}", path.display()))?;
    read(path, &text, model).map_err(anyhow::Error::msg)
}

/// Reads the config `text` of the file at `path` (data folders are resolved against its
/// folder); the model is `model`, else the config's folder name.
pub fn read(path: &Path, text: &str, model: Option<&str>) -> Result<PaddleRecJob, String> {
    let config: Value = serde_yaml_ng::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = if config.is_null() { json!({}) } else { config };
    let Some(config) = config.as_object() else {
        return Err(format!("{}: not a mapping of sections (runner, hyper_parameters)", path.display()));
    };
    let folder = path.parent().unwrap_or(Path::new("."));
    let name = match model {
        Some(m) => m.to_string(),
        None => folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    };
    if !MODELS.contains(&name.as_str()) {
        return Err(format!(
            "{}: model '{name}'; oar reads PaddleRec's {} (name one: --paddlerec-model, model=)",
            path.display(),
            MODELS.join(", ")
        ));
    }
    let section = |key: &str| config.get(key).and_then(Value::as_object).cloned().unwrap_or_default();
    let (runner, hp) = (section("runner"), section("hyper_parameters"));
    let at = |what: String| move |e: String| format!("{}: {what}: {e}", path.display());
    let mut out = PaddleRecJob {
        job: JobConfig::default(),
        train: None,
        test: None,
        output: None,
        mode: None,
        unused: Vec::new(),
    };
    let mut train = json!({});
    for (key, value) in &runner {
        let place = |v: &Value| v.as_str().map(|s| folder.join(s)).ok_or_else(|| "not a path".to_string());
        match key.as_str() {
            "train_data_dir" => out.train = Some(place(value).map_err(at(format!("runner.{key}")))?),
            "test_data_dir" => out.test = Some(place(value).map_err(at(format!("runner.{key}")))?),
            "model_save_path" => out.output = Some(place(value).map_err(at(format!("runner.{key}")))?),
            "sync_mode" => {
                out.mode = Some(match value.as_str() {
                    Some("async") => Mode::Async,
                    Some("sync") => Mode::Sync,
                    Some("geo") => Mode::Geo,
                    _ => {
                        return Err(format!(
                            "{}: runner.sync_mode {value}: oar runs async, sync and geo",
                            path.display()
                        ))
                    }
                })
            }
            "epochs" => train["passes"] = count(value).map_err(at(format!("runner.{key}")))?.into(),
            "train_batch_size" => train["batch_size"] = count(value).map_err(at(format!("runner.{key}")))?.into(),
            "print_interval" => train["log_every"] = count(value).map_err(at(format!("runner.{key}")))?.into(),
            "thread_num" => train["threads"] = count(value).map_err(at(format!("runner.{key}")))?.into(),
            "geo_step" => train["geo_k_steps"] = count(value).map_err(at(format!("runner.{key}")))?.into(),
            _ => out.unused.push((format!("runner.{key}"), ignored(key).to_string())),
        }
    }
    let read = ["optimizer", "sparse_feature_dim", "fc_sizes", "sparse_inputs_slots", "dense_input_dim"];
    for key in hp.keys().filter(|k| !read.contains(&k.as_str())) {
        let why = if key == "sparse_feature_number" {
            "oar's tables grow with the ids seen"
        } else {
            "not part of oar's model"
        };
        out.unused.push((format!("hyper_parameters.{key}"), why.to_string()));
    }
    for key in config.keys().filter(|k| *k != "runner" && *k != "hyper_parameters") {
        out.unused.push((key.clone(), "not read by oar yet".to_string()));
    }
    let number =
        |key: &str, default: u64| hp.get(key).map_or(Ok(default), count).map_err(at(format!("hyper_parameters.{key}")));
    let (dim, slots, dense) =
        (number("sparse_feature_dim", 9)?, number("sparse_inputs_slots", 27)?, number("dense_input_dim", 13)?);
    if slots < 2 {
        return Err(format!(
            "{}: hyper_parameters.sparse_inputs_slots {slots}: the label and a slot at least",
            path.display()
        ));
    }
    let hidden: Vec<u64> = match hp.get("fc_sizes") {
        None => vec![512, 256, 128, 32],
        Some(v) => v
            .as_array()
            .ok_or("not a list")
            .and_then(|l| l.iter().map(|h| count(h).map_err(|_| "not a list of counts")).collect())
            .map_err(|e| at("hyper_parameters.fc_sizes".into())(e.to_string()))?,
    };
    let optimizer = optimizer(hp.get("optimizer"), &mut out.unused).map_err(at("hyper_parameters.optimizer".into()))?;
    let slots = format!("1..{}", slots - 1);
    let job = json!({
        "model": graph(&name, dim, &hidden, &slots),
        "dense_optimizer": optimizer,
        "sparse_optimizer": optimizer,
        "train": train,
        "data": {
            "format": "slots",
            "labels": ["click"],
            "dense": [{ "name": "dense_feature", "width": dense }],
            "slots": [slots],
        },
    });
    out.job = serde_json::from_value(job).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(out)
}

/// A count (a non-negative integer).
fn count(v: &Value) -> Result<u64, String> {
    v.as_u64().ok_or_else(|| format!("{v} is not a count"))
}

/// The model `name`'s graph, as a job file's `[model]`.
fn graph(name: &str, dim: u64, hidden: &[u64], slots: &str) -> Value {
    let mut layers = vec![
        json!({ "name": "slots", "type": "embedding", "table": "emb", "slots": slots }),
        json!({ "name": "x", "type": "concat", "inputs": ["slots", "dense"] }),
    ];
    let mut tables = vec![json!({ "name": "emb", "dim": dim })];
    if name == "dnn" {
        layers.push(json!({ "name": "logit", "type": "mlp", "input": "x", "hidden": hidden, "out": 1 }));
    } else {
        tables.push(json!({ "name": "w", "dim": 1 }));
        layers.extend([
            json!({ "name": "wide", "type": "embedding", "table": "w", "slots": slots }),
            json!({ "name": "lr_s", "type": "reduce_sum", "input": "wide", "over": "all" }),
            json!({ "name": "lr_d", "type": "linear", "input": "dense", "out": 1 }),
            json!({ "name": "deep", "type": "mlp", "input": "x", "hidden": hidden, "out": 1 }),
        ]);
        let mut parts = vec!["lr_s", "lr_d", "deep"];
        if name == "deepfm" {
            layers.push(json!({ "name": "fm", "type": "fm", "input": "slots" }));
            parts.push("fm");
        }
        layers.push(json!({ "name": "logit", "type": "add", "inputs": parts }));
    }
    json!({ "output": "logit", "loss": "log_loss", "tables": tables, "layers": layers })
}

/// `hyper_parameters.optimizer` (`class`, `learning_rate`; `strategy` noted as unused).
fn optimizer(spec: Option<&Value>, unused: &mut Vec<(String, String)>) -> Result<Value, String> {
    let empty = serde_json::Map::new();
    let spec = match spec {
        None | Some(Value::Null) => &empty,
        Some(v) => v.as_object().ok_or("not a mapping")?,
    };
    let class = spec.get("class").map_or(Some("adam".to_string()), |c| c.as_str().map(str::to_lowercase));
    let kind = match class.as_deref() {
        Some(k @ ("adam" | "adagrad" | "sgd")) => k.to_string(),
        _ => return Err(format!("class {}: oar reads adam, adagrad, sgd", spec.get("class").unwrap_or(&Value::Null))),
    };
    if spec.contains_key("strategy") {
        unused.push(("hyper_parameters.optimizer.strategy".into(), "runner.sync_mode gives the mode".into()));
    }
    let lr = match spec.get("learning_rate") {
        None => 1e-3,
        Some(v) => {
            v.as_f64().filter(|l| l.is_finite() && *l > 0.0).ok_or(format!("learning_rate {v}: a positive number"))?
        }
    };
    Ok(json!({ "kind": kind, "lr": lr }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DNN: &str = "runner:\n  train_data_dir: \"data/train\"\n  train_batch_size: 16\n  epochs: 3\n  \
                       print_interval: 2\n  sync_mode: \"async\"\n  use_gpu: False\n\
                       hyper_parameters:\n  optimizer:\n    class: Adam\n    learning_rate: 0.001\n    strategy: async\n  \
                       sparse_inputs_slots: 27\n  sparse_feature_number: 1000001\n  sparse_feature_dim: 9\n  \
                       dense_input_dim: 13\n  fc_sizes: [512, 256, 128, 32]\n";

    #[test]
    fn rank_dnn_reads_as_the_zoo_job_with_its_runner_as_settings() {
        let rec = read(Path::new("m/rank/dnn/config.yaml"), DNN, None).unwrap();
        assert_eq!((rec.job.train.batch_size, rec.job.train.passes, rec.job.train.log_every), (16, 3, 2));
        assert_eq!(rec.train, Some(PathBuf::from("m/rank/dnn/data/train")));
        assert_eq!(rec.mode, Some(Mode::Async));
        let geo = DNN.replace("sync_mode: \"async\"", "sync_mode: \"geo\"\n  geo_step: 400");
        let rec = read(Path::new("m/rank/dnn/config.yaml"), &geo, None).unwrap();
        assert_eq!((rec.mode, rec.job.train.geo_k_steps), (Some(Mode::Geo), 400), "Paddle's GEO, its k_steps");
        let zoo = JobConfig::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/paddlerec_slots.toml"));
        let zoo = zoo.unwrap();
        assert_eq!((&rec.job.model, &rec.job.data), (&zoo.model, &zoo.data));
        let keys: Vec<&str> = rec.unused.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["runner.use_gpu", "hyper_parameters.sparse_feature_number", "hyper_parameters.optimizer.strategy"]
        );
    }

    #[test]
    fn every_model_builds_and_what_oar_cannot_run_is_refused_by_name() {
        for m in MODELS {
            let rec = read(Path::new("c.yaml"), DNN, Some(m)).unwrap();
            rec.job.validate_with(&crate::model::Registry::with_builtin()).unwrap();
        }
        for (text, model, says) in [
            (DNN, Some("dcn"), "model 'dcn'; oar reads PaddleRec's dnn, wide_deep, deepfm"),
            ("runner:\n  sync_mode: heter\n", Some("dnn"), "runner.sync_mode \"heter\": oar runs async, sync and geo"),
            ("runner:\n  epochs: -1\n", Some("dnn"), "runner.epochs: -1 is not a count"),
            ("hyper_parameters:\n  optimizer: {class: Lamb}\n", Some("dnn"), "class \"Lamb\""),
            ("hyper_parameters:\n  fc_sizes: 3\n", Some("dnn"), "fc_sizes: not a list"),
            ("hyper_parameters:\n  sparse_inputs_slots: 1\n", Some("dnn"), "the label and a slot"),
            ("- a\n- b\n", Some("dnn"), "not a mapping"),
            ("runner: [\n", Some("dnn"), "c.yaml"),
        ] {
            let e = read(Path::new("c.yaml"), text, model).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
