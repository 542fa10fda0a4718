//! `oar train|launch --paddlerec-config`: PaddleRec's `config.yaml` run from the command line,
//! trained to the same model as the zoo job it maps to, and what oar cannot run refused in one
//! line. The training test reads PaddleRec's slot sample file from `../shared` and skips
//! without it.

use std::path::Path;

use crate::util::{oar, shared_data, text};

/// A PaddleRec rank/dnn layout in `root`: `models/rank/dnn/config.yaml` with `runner` lines
/// `runner`, its training data the slot sample file; the config's path.
fn layout(root: &Path, runner: &str, sample: Option<&Path>) -> std::path::PathBuf {
    let folder = root.join("models/rank/dnn");
    std::fs::create_dir_all(folder.join("data/train")).unwrap();
    if let Some(sample) = sample {
        std::fs::copy(sample, folder.join("data/train/part-0")).unwrap();
    }
    let config = format!(
        "runner:\n  train_data_dir: \"data/train\"\n  model_save_path: \"output\"\n  use_gpu: False\n{runner}\
         hyper_parameters:\n  optimizer:\n    class: Adam\n    learning_rate: 0.001\n  sparse_feature_dim: 9\n  \
         fc_sizes: [512, 256, 128, 32]\n"
    );
    std::fs::write(folder.join("config.yaml"), config).unwrap();
    folder.join("config.yaml")
}

#[test]
fn a_paddlerec_config_trains_as_the_zoo_job_it_maps_to() {
    let Some(data) = shared_data() else {
        eprintln!("skipped: ../shared/data is absent (PaddleRec's slot sample file)");
        return;
    };
    let sample = data.join("criteo/paddlerec_slot_sample_train.txt");
    let tmp = tempfile::tempdir().unwrap();
    let config = layout(tmp.path(), "  train_batch_size: 16\n  epochs: 1\n", Some(&sample));
    let o = oar(&["train", "--paddlerec-config", config.to_str().unwrap(), "--threads", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let saved = config.parent().unwrap().join("output");
    // The zoo's job file for PaddleRec's slots, with the config's one Adam for every parameter
    // (PaddleRec's dygraph optimizer), trains the same model: the same scores, bit for bit.
    let zoo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/paddlerec_slots.toml"));
    let zoo = zoo.unwrap().replace("kind = \"adagrad\"\nlr = 0.05", "kind = \"adam\"\nlr = 0.001");
    assert!(zoo.contains("[sparse_optimizer]\nkind = \"adam\""));
    let (job, out) = (tmp.path().join("zoo.toml"), tmp.path().join("zoo"));
    std::fs::write(&job, zoo).unwrap();
    let z = oar(&[
        "train",
        "--config",
        job.to_str().unwrap(),
        "--train",
        sample.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert!(z.status.success(), "{}", text(&z));
    let scores = |model: &Path| {
        let o = oar(&["predict", "--model", model.to_str().unwrap(), "--data", sample.to_str().unwrap(), "--out", "-"]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(!o.stdout.is_empty());
        o.stdout
    };
    assert_eq!(scores(&saved), scores(&out), "the config's model scores as the zoo job's");
}

#[test]
fn what_oar_cannot_run_is_one_line_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = layout(tmp.path(), "  sync_mode: \"heter\"\n", None);
    let o = oar(&["launch", "--paddlerec-config", config.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("runner.sync_mode \"heter\": oar runs async, sync and geo"), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("oar: error")).count(), 1, "{err}");
    let o = oar(&["train", "--paddlerec-config", config.to_str().unwrap(), "--paddlerec-model", "dcn"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("model 'dcn'; oar reads PaddleRec's dnn, wide_deep, deepfm"));
    let o = oar(&["train", "--paddlerec-config", config.to_str().unwrap(), "--config", "x.toml"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{}", text(&o));
}
