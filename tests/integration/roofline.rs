//! `oar bench --roofline` end to end, as a process: the CTR-DNN step's matrix products timed
//! with oar's kernel beside the reference BLAS (OpenBLAS, which `.ci/run` installs; without it
//! the table has oar's column alone and says why), then local training whose matrix FLOPs,
//! counted inside `matmul`, must be exactly the step's products per sample, and the same on one
//! server and one trainer, whose step splits into the trainer's work and the server's replies.

use super::util::oar;

/// The number after `before` in `line`, up to the next space.
fn number_after(line: &str, before: &str) -> f64 {
    let rest = &line[line.find(before).unwrap_or_else(|| panic!("no {before:?} in {line}")) + before.len()..];
    rest.split([' ', '%', ')']).next().unwrap().parse().unwrap()
}

#[test]
fn the_roofline_counts_the_models_flops_and_splits_a_step() {
    let o = oar(&["bench", "--roofline", "--rounds", "1", "--seconds", "0.3", "--lines", "3000"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.starts_with("CPU: ") && out.contains("bf16 products: "), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| fc")).collect();
    assert_eq!(rows.len(), 12, "forward, dW and dx of 4 layers: {out}");
    // Columns: product, shape, oar f32, oar bf16, bf16 / f32, reference, oar / reference.
    let cells = |row: &str, at: std::ops::Range<usize>| -> Vec<String> {
        row.split('|').map(str::trim).skip(1).skip(at.start).take(at.len()).map(String::from).collect()
    };
    let with_reference = !out.contains("reference BLAS: none");
    if with_reference {
        assert!(
            rows.iter().all(|r| cells(r, 5..7).iter().all(|c| c != "-")),
            "every product has the reference's rate: {out}"
        );
    } else {
        eprintln!("no reference BLAS here (apt install libopenblas0): oar's column alone");
    }
    // bf16 products are timed exactly where the CPU has them, and the peaks line says so.
    let bf16 = out.contains("bf16 products: available");
    assert!(rows.iter().all(|r| cells(r, 3..5).iter().all(|c| (c != "-") == bf16)), "{out}");
    let peaks = out.lines().find(|l| l.starts_with("one core's arithmetic peak")).unwrap();
    assert!(number_after(peaks, "f32 FMA ") > 0.0 && peaks.contains("bf16 pair products") == bf16, "{peaks}");
    if !bf16 {
        eprintln!("no avx512_bf16 here: the bf16 columns are empty");
    }
    // The step's products a sample, from the shapes, equal what the counters saw in training.
    let step = out.lines().find(|l| l.starts_with("| the step (")).unwrap();
    let from_shapes = number_after(step, "the step (");
    assert!((from_shapes - 2.58).abs() < 0.01, "273-400-400-400-1 at 6 x in x out FLOPs a sample: {step}");
    let trained: Vec<&str> =
        out.lines().filter(|l| l.contains("MFLOP of matrix products a sample (counted)")).collect();
    assert!(!trained.is_empty(), "{out}");
    for line in trained {
        assert_eq!(number_after(line, "loop, "), from_shapes, "{line}");
    }
    let split = out.lines().find(|l| l.contains("a step's time:") && l.contains("embedding pull")).unwrap();
    let parts = ["matrix products ", "the loss ", "embedding pull ", "optimizer ", "waiting for data "];
    let total: f64 = parts.iter().map(|p| number_after(split, p)).sum();
    assert!((95.0..=105.0).contains(&total), "the parts of a step add up to its time: {split}");
    // A distributed step: the time on the server's replies, counted by the trainer, is the
    // server's handling (counted by the server) and the transport.
    let split = out.lines().find(|l| l.contains("a step's time:") && l.contains("server's replies")).unwrap();
    let parts = ["matrix products ", "the loss ", "placing rows) ", "server's replies ", "waiting for data "];
    let total: f64 = parts.iter().map(|p| number_after(split, p)).sum();
    assert!((95.0..=105.0).contains(&total), "the parts of a distributed step add up to its time: {split}");
    let (replies, server) = (number_after(split, "server's replies "), number_after(split, "optimizers: "));
    assert!(server > 0.0, "the server counted its handling: {split}");
    assert!((server + number_after(split, "the transport: ") - replies).abs() <= 1.0, "{split}");
}

#[test]
fn a_missing_reference_blas_leaves_oars_column_with_the_reason() {
    let o = oar(&[
        "bench",
        "--roofline",
        "--rounds",
        "1",
        "--seconds",
        "0.1",
        "--lines",
        "1000",
        "--blas",
        "/nonexistent/libblas.so",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("reference BLAS: none (cannot load /nonexistent/libblas.so"), "{out}");
    assert!(out.lines().filter(|l| l.starts_with("| fc")).all(|l| l.ends_with("| - | - |")), "{out}");
}

#[test]
fn the_zoos_products_are_recorded_from_training_and_timed_against_the_reference() {
    let o = oar(&[
        "bench",
        "--roofline",
        "--model",
        "xDeepFM",
        "--model",
        "LR",
        "--rounds",
        "1",
        "--seconds",
        "0.1",
        "--lines",
        "1500",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let summary = |model: &str| -> Vec<String> {
        let row = out.lines().find(|l| l.starts_with(&format!("| {model} |"))).unwrap_or_else(|| panic!("{out}"));
        row.split('|').map(str::trim).skip(1).map(String::from).collect()
    };
    // xDeepFM's products a sample, by hand from examples/zoo/xdeepfm.toml (forward, weight and
    // input gradients, 2 x in x out FLOPs each): the dense values' linear (no input gradient:
    // they are data) 2 x 2 x 13; the CIN's two layers, D = 10 positions of 26 x 26 -> 32 and
    // 32 x 26 -> 32 maps; its linear 64 -> 1; the MLP 273-400-400-400-1.
    let by_hand = 2.0 * 2.0 * 13.0
        + 6.0 * 10.0 * (26.0 * 26.0 * 32.0 + 32.0 * 26.0 * 32.0)
        + 6.0 * 64.0
        + 6.0 * (273.0 * 400.0 + 2.0 * 400.0 * 400.0 + 400.0);
    let row = summary("xDeepFM");
    assert_eq!(row[1], format!("{:.3}", by_hand / 1e6), "recorded from the training pass: {out}");
    assert!(row[2].ends_with("(100% of the FLOPs)"), "the CIN's and the MLP's shapes are timed: {out}");
    assert!(
        out.lines().any(|l| l.starts_with("| 5120 x 832 x 32 | a b^T |")),
        "the CIN's second layer is one product over a batch's 512 samples x 10 positions: {out}"
    );
    assert_eq!(summary("LR")[1], "0.000", "{out}");
    let with_reference = !out.contains("reference BLAS: none");
    for model in ["xDeepFM", "LR"] {
        let row = summary(model);
        assert!(row[3].parse::<f64>().unwrap() > 0.0, "{out}");
        assert_eq!(row[5] != "-", with_reference, "the ratio is there exactly with a reference: {out}");
    }
    let o = oar(&["bench", "--roofline", "--model", "ResNet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("\"ResNet\"") && err.contains("xDeepFM"), "{err}");
}
