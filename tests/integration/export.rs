//! `oar export`: every zoo model (and the multi-hot, multi-task and softmax examples, MMoE, PLE
//! and ESMM) trained,
//! exported, checked by `onnx.checker`, and scored by onnxruntime through
//! `examples/serve/onnx_predict.py` with both the complete model and the dense graph plus numpy
//! lookups: the scores equal `oar predict`'s within 1e-5 and give `oar eval`'s AUC. Needs a
//! Python with onnx, onnxruntime, numpy and safetensors (CI installs them); skips with a message
//! without one.

use std::path::{Path, PathBuf};

use crate::util::*;

/// A Python that can run the script, if there is one.
fn python() -> Option<String> {
    python_with("onnx, onnxruntime, numpy, safetensors")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/serve/onnx_predict.py")
}

/// Every line's scores (one column per head).
fn scores(file: &Path) -> Vec<Vec<f32>> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(|v| v.parse().unwrap()).collect())
        .collect()
}

/// Trains `job` on `train` for one pass, then checks the export against `oar predict` on the
/// file `test`; returns the largest score difference seen.
fn check(py: &str, dir: &Path, job: &Path, train: &Path, test: &Path) -> f32 {
    let name = job.file_stem().unwrap().to_string_lossy().into_owned();
    let (model, export, predicted) = (dir.join(&name), dir.join(format!("{name}.export")), dir.join("predicted"));
    let s = |p: &Path| p.display().to_string();
    let o = oar(&["train", "--config", &s(job), "--train", &s(train), "--output", &s(&model), "--passes", "1"]);
    assert!(o.status.success(), "{name}: {}", text(&o));
    let o = oar(&["export", "--model", &s(&model), "--out", &s(&export)]);
    assert!(o.status.success(), "{name}: {}", text(&o));
    assert!(text(&o).contains("model.onnx, tables.safetensors"), "{name}: {}", text(&o));
    // The test's own job files (`multi_task.toml` reads through a pipe_command).
    let args = ["predict", "--model", &s(&model), "--data", &s(test), "--out", &s(&predicted), "--no-progress"];
    let o = oar(&[&args[..], &["--trust-pipe-command"]].concat());
    assert!(o.status.success(), "{name}: {}", text(&o));
    let want = scores(&predicted);

    // The files are valid ONNX by ONNX's own checker.
    let checker = "import onnx, sys\nfor p in sys.argv[1:]: onnx.checker.check_model(onnx.load(p), full_check=True)";
    let o = std::process::Command::new(py)
        .args(["-c", checker, &s(&export.join("dense.onnx")), &s(&export.join("model.onnx"))])
        .output()
        .unwrap();
    assert!(o.status.success(), "{name}: onnx.checker: {}", text(&o));

    let saved = oar::serve::predict::load(&model, &Default::default()).unwrap();
    let files = vec![test.to_path_buf()];
    let mut store = oar::train::Store::local(saved.shard);
    let evals = oar::train::evaluate_heads(&mut store, &saved.model, &saved.schema, &files, 4096, false).unwrap();
    let mut labels = vec![Vec::new(); evals.len()];
    for batch in oar::data::Reader::spawn(files, oar::data::ReaderConfig::new(&saved.schema, 4096)) {
        let batch = batch.unwrap();
        for (h, l) in labels.iter_mut().enumerate() {
            l.extend_from_slice(&saved.model.labels(&batch, h));
        }
    }
    let (mut worst, mut auc_gap) = (0f32, 0f64);
    for graph in ["model", "dense"] {
        let out = dir.join(format!("{name}.{graph}.tsv"));
        let o = std::process::Command::new(py)
            .arg(script())
            .args(["--export", &s(&export), "--data", &s(test), "--out", &s(&out), "--graph", graph])
            .output()
            .unwrap();
        assert!(o.status.success(), "{name} {graph}: {}", text(&o));
        let got = scores(&out);
        assert_eq!(got.len(), want.len(), "{name} {graph}: one line per input line");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{name} {graph} line {}: one score per head", i + 1);
            for (a, b) in g.iter().zip(w) {
                let d = (a - b).abs();
                assert!(d <= 1e-5, "{name} {graph} line {}: onnxruntime {a}, oar predict {b}", i + 1);
                worst = worst.max(d);
            }
        }
        for (h, eval) in evals.iter().enumerate() {
            if saved.model.losses()[h] == oar::model::Loss::LogLoss {
                let column: Vec<f32> = got.iter().map(|l| l[h]).collect();
                let (auc, want) = (oar::observe::metrics::auc(&column, &labels[h]).unwrap(), eval.auc.unwrap());
                assert!((auc - want).abs() < 1e-4, "{name} {graph} head {h}: AUC {auc}, oar eval {want}");
                auc_gap = auc_gap.max((auc - want).abs());
            }
        }
    }
    eprintln!(
        "{name}: onnxruntime within {worst:e} of oar predict on {} lines, AUC within {auc_gap:e} of oar eval's",
        want.len()
    );
    worst
}

#[test]
fn every_zoo_model_exports_to_onnx_that_scores_as_oar_predict() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(&dir.path().join("data"), 1, 4000, 1500);
    let test = test.join("part-00000");
    for name in ZOO {
        check(&py, dir.path(), &zoo_job(name), &train, &test);
    }
    check(&py, dir.path(), &gatenet_variant(dir.path()), &train, &test);
    check(&py, dir.path(), &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn.toml"), &train, &test);
    // Statistics from a file instead of computed at start (the zoo models above computed
    // theirs): the graphs scale their `dense` input themselves either way.
    let stats = dir.path().join("stats.json");
    let o = oar(&["data", "stats", "--data", train.to_str().unwrap(), "--out", stats.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let job = dir.path().join("deepfm_standardized.toml");
    let zoo = std::fs::read_to_string(zoo_job("deepfm")).unwrap();
    std::fs::write(&job, zoo.replace("[data]", "[data]\ndense_stats = \"stats.json\"")).unwrap();
    check(&py, dir.path(), &job, &train, &test);
}

#[test]
fn multi_hot_multi_task_normalizing_and_softmax_models_export_too() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    // Multi-hot bags with sum, mean and weighted pooling; a two-head model behind a pipe_command.
    let data = dir.path().join("slots");
    oar::data::gen::slots::generate(&oar::data::gen::GenConfig {
        lines: 4000,
        test_lines: 1000,
        seed: 3,
        parts: 1,
        out: data.clone(),
    })
    .unwrap();
    let test = data.join("test/part-00000");
    check(&py, dir.path(), &examples.join("multi_hot.toml"), &data.join("train"), &test);
    check(&py, dir.path(), &examples.join("multi_task.toml"), &data.join("train"), &test);
    // data_norm and batch_norm: the servers' statistics folded into a scale and a shift.
    let (train, criteo_test) = gen_data(&dir.path().join("criteo"), 1, 2000, 500);
    check(&py, dir.path(), &examples.join("ctr_dnn_norm.toml"), &train, &criteo_test.join("part-00000"));
    // A softmax head over the PTB dictionary (the true word's probability), real data.
    let Some(shared) = shared_data() else {
        eprintln!("skipped the softmax model: ../shared/data is absent");
        return;
    };
    let ptb = dir.path().join("ptb");
    let o = oar(&["data", "prepare", "imikolov", "--src", &shared.join("ptb").display().to_string(), "--out"]
        .into_iter()
        .chain([ptb.to_str().unwrap()])
        .collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<String> =
        std::fs::read_to_string(ptb.join("train.txt")).unwrap().lines().map(String::from).collect();
    std::fs::write(ptb.join("small.txt"), lines[..20000].join("\n") + "\n").unwrap();
    std::fs::write(ptb.join("few.txt"), lines[20000..21000].join("\n") + "\n").unwrap();
    check(&py, dir.path(), &examples.join("imikolov_graph.toml"), &ptb.join("small.txt"), &ptb.join("few.txt"));
    // Expert mixtures (MMoE, PLE) on census lines through their reader; ESMM's CTCVR product
    // on the Ali-CCP sample (its training lines: the test file has no CTCVR positive).
    let (train, test) = census_split(&dir.path().join("census")).unwrap();
    for name in ["mmoe", "ple"] {
        check(&py, dir.path(), &zoo_job(name), &train, &test.join("part-00000"));
    }
    let aliccp = shared.join("multitask/paddlerec_esmm_aliccp_train_small.txt");
    check(&py, dir.path(), &zoo_job("esmm"), &aliccp, &aliccp);
    // A sequence embedding (ordered, truncated, padded, masked) and target attention.
    let amazon = shared.join("din/paddlerec_din_amazon_sample.txt");
    check(&py, dir.path(), &zoo_job("din"), &amazon, &amazon);
    // DIN with Dice: its running statistics folded into a scale and a shift per unit.
    check(&py, dir.path(), &din_dice_variant(dir.path()), &amazon, &amazon);
    // BST with learned positions over a history of 20.
    check(&py, dir.path(), &zoo_job("bst_din_format"), &amazon, &amazon);
    // DIEN with its AUGRU swapped for DIN's pooling over the GRU's states: the GRU as ONNX's.
    let dien = std::fs::read_to_string(zoo_job("dien")).unwrap();
    let start = dien.find("  { name = \"scores\"").unwrap();
    let end = dien.find("  { name = \"x\"").unwrap();
    let pooled = "  { name = \"evolution\", type = \"target_attention\", inputs = [\"target\", \"interests\", \"hist.mask\"] },\n";
    let gru_job = dir.path().join("gru.toml");
    std::fs::write(&gru_job, format!("{}{pooled}{}", &dien[..start], &dien[end..])).unwrap();
    check(&py, dir.path(), &gru_job, &amazon, &amazon);
    let amazon = shared.join("din/paddlerec_bst_amazon_sample.txt");
    check(&py, dir.path(), &zoo_job("bst"), &amazon, &amazon);
}

/// DIEN is refused by its AUGRU's name; with its auxiliary loss (`dien_aux.toml`), by the
/// training-only head's.
#[test]
fn dien_is_refused_by_its_augrus_name() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data is absent (DIEN reads PaddleRec's Amazon sample)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (model, out) = (dir.path().join("model"), dir.path().join("export"));
    let s = |p: &Path| p.display().to_string();
    let amazon = shared.join("din/paddlerec_din_amazon_sample.txt");
    let o = oar(&["train", "--config", &s(&zoo_job("dien")), "--train", &s(&amazon), "--output", &s(&model)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = oar(&["export", "--model", &s(&model), "--out", &s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("layer \"evolution\" (augru) cannot be exported"), "{}", text(&o));
    let model = dir.path().join("aux");
    let o = oar(&["train", "--config", &s(&zoo_job("dien_aux")), "--train", &s(&amazon), "--output", &s(&model)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = oar(&["export", "--model", &s(&model), "--out", &s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("head \"aux\" is a training-only loss"), "{}", text(&o));
}

#[test]
fn a_layer_without_an_onnx_form_is_refused_by_name() {
    // The custom layer example's `glu_gate` type has no export: the refusal names the layer.
    #[derive(Debug)]
    struct Opaque;
    impl oar::nn::layer::Layer for Opaque {
        fn output(&self) -> oar::nn::layer::Shape {
            oar::nn::layer::Shape::flat(1)
        }
        fn forward(&self, _: &oar::nn::layer::Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
            y.copy_from_slice(&x[0][..y.len()]);
        }
        fn backward(
            &self,
            _: &oar::nn::layer::Ctx,
            _: &[f32],
            _: &[&[f32]],
            _: &[f32],
            _: &[f32],
            _: &mut [f32],
            _: &mut [f32],
            _: &mut [Option<&mut [f32]>],
        ) {
        }
    }
    let registry = oar::model::Registry::default().register("opaque", |_, _| Ok(Box::new(Opaque)));
    let mut b = oar::model::GraphBuilder::new();
    b.table("t", 1);
    let e = b.embedding("e", "t", &["C1"], oar::model::Pooling::Sum);
    let r = b.layer("mystery", "opaque", &[&e], serde_json::json!({}));
    b.output(&r, oar::model::Loss::LogLoss);
    let (model, _) =
        oar::train::job_config::build_model(&b.build(), &oar::data::DataConfig::default(), &registry).unwrap();
    let params = vec![0.0; model.dense_len()];
    let err = model.to_onnx(&params, None, None).err().expect("refused");
    assert!(err.contains("layer \"mystery\" (opaque) cannot be exported"), "{err}");
}

/// An export cannot overwrite the saved model it reads: `--out` the job's folder (whose root
/// `manifest.json` would then be found before its passes) or a pass folder (whose manifest it
/// would replace) is refused, and the model still evaluates; a folder beside it is fine, and
/// so is exporting again over an earlier export.
#[test]
fn an_export_into_the_saved_models_own_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(&dir.path().join("data"), 1, 300, 50);
    let model = dir.path().join("model");
    let s = |p: &Path| p.display().to_string();
    let o = oar(&["train", "--train", &s(&train), "--hidden", "4", "--output", &s(&model)]);
    assert!(o.status.success(), "{}", text(&o));
    for (out, why) in [(model.clone(), "holds the saved model"), (model.join("pass-0001"), "is not an export's")] {
        let o = oar(&["export", "--model", &s(&model), "--out", &s(&out)]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(why), "{}", text(&o));
    }
    let o = oar(&["export", "--model", &s(&model.join("pass-0001")), "--out", &s(&model)]);
    assert!(text(&o).contains("holds the saved model"), "{}", text(&o));
    let o = oar(&["eval", "--model", &s(&model), "--data", &s(&test)]);
    assert!(o.status.success(), "the saved model is intact: {}", text(&o));
    let beside = dir.path().join("export");
    for _ in 0..2 {
        let o = oar(&["export", "--model", &s(&model), "--out", &s(&beside)]);
        assert!(o.status.success(), "{}", text(&o));
    }
    // A named pipe planted as the folder's manifest is named, not waited on (reading it to
    // check whose it was blocked until a writer came).
    let piped = dir.path().join("piped");
    std::fs::create_dir(&piped).unwrap();
    let c = std::ffi::CString::new(piped.join("manifest.json").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string naming a new path in a fresh folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = oar(&["export", "--model", &s(&model), "--out", &s(&piped)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not a regular file (a named pipe)"), "{}", text(&o));
    // A folder at one of the export's names is refused before anything is written: the export
    // failed half way, with dense.onnx replaced.
    let _ = std::fs::remove_file(beside.join("model.onnx"));
    std::fs::create_dir(beside.join("model.onnx")).unwrap();
    let dense_before = std::fs::metadata(beside.join("dense.onnx")).unwrap().modified().unwrap();
    let o = oar(&["export", "--model", &s(&model), "--out", &s(&beside)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("model.onnx is a folder, where the export writes a file"), "{}", text(&o));
    assert_eq!(std::fs::metadata(beside.join("dense.onnx")).unwrap().modified().unwrap(), dense_before);
}
