//! `oar bench --paddle` end to end: PaddlePaddle 3.0's own parameter servers and trainers (the
//! Python `.ci/run` installs them into, `OAR_PADDLE_PS_PYTHON`) train the CTR-DNN beside oar's
//! on a small generated set, and a Python without Paddle is refused in one line.

use crate::util::*;

/// The cells of the table's rows for `system`.
fn rows<'a>(out: &'a str, system: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|c| c.len() > 3 && c[2] == system)
        .collect()
}

#[test]
fn paddles_parameter_servers_train_the_same_job_beside_oars() {
    let Ok(python) = std::env::var("OAR_PADDLE_PS_PYTHON") else {
        eprintln!("skipped: OAR_PADDLE_PS_PYTHON is not set (.ci/run installs paddlepaddle==3.0.0 and sets it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 2, 3_000, 2_000);
    let o = oar(&["bench", "--paddle", &python, "--data", dir.path().to_str().unwrap(), "--rounds", "1"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for system in ["oar", "PaddlePaddle"] {
        let r = rows(&out, system);
        assert_eq!(r.len(), 1, "one round: {out}");
        // Columns: round, system, samples trained, end to end, in the loops, AUC, test samples.
        assert_eq!(r[0][3], "6000", "{system} trained every line: {out}");
        assert_eq!(r[0][7], "2000", "{system}'s evaluation counted every test line: {out}");
        let rates: Vec<f64> = r[0][4..6].iter().map(|c| c.parse().unwrap()).collect();
        assert!(rates.iter().all(|&x| x > 0.0), "{out}");
        let auc: f64 = r[0][6].parse().unwrap();
        assert!((0.0..=1.0).contains(&auc), "{out}");
    }
    assert!(out.contains("medians: end to end oar "), "{out}");
}

#[test]
fn a_python_without_paddle_is_refused_in_one_line() {
    for python in ["/nonexistent/python3", "true"] {
        let o = oar(&["bench", "--paddle", python, "--lines", "100"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("--paddle {python}: cannot")), "{err}");
    }
}
