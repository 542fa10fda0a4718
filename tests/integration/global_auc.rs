//! The pass's training AUC over every trainer's samples: histograms of Paddle's AUC buckets
//! sent to server 0 and merged there exactly, once per trainer.

use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig, ClientError};
use oar::observe::metrics::AucBuckets;
use oar::protocol::ErrorCode;
use oar::protocol::Mode;
use oar::server::ServerConfig;

/// Server 0 adds the trainers' histograms of a pass exactly, a trainer sending again replaces
/// its own (counted once), a tool may read the figure but not send one, and a histogram of
/// the wrong shape or an unknown pass is refused naming it.
#[test]
fn server_zero_merges_each_trainers_histogram_once() {
    let server = start_server(ServerConfig { exit_when_done: false, ..server_config(0, 1, 2, Mode::Async) });
    let config = ClientConfig::new(vec![server.addr.clone()], "test", Duration::from_secs(5), Duration::from_secs(5));
    let (mut t0, mut t1) = (
        Client::connect(&config.clone().as_trainer(0)).unwrap(),
        Client::connect(&config.clone().as_trainer(1)).unwrap(),
    );
    let mut tool = Client::connect(&config).unwrap();
    let (probs, labels) = ([0.9f32, 0.8, 0.3, 0.7, 0.1, 0.2], [1.0f32, 0.0, 1.0, 1.0, 0.0, 0.0]);
    let (a, b) = (AucBuckets::of(&probs[..3], &labels[..3]), AucBuckets::of(&probs[3..], &labels[3..]));
    t0.pass_auc(0, 1, &AucBuckets::of(&[0.5], &[1.0])).unwrap();
    t0.pass_auc(0, 1, &a).unwrap(); // sent again: replaces the first
    t1.pass_auc(1, 1, &b).unwrap();
    let global = tool.global_auc(1).unwrap();
    assert_eq!(global.trainers, [0, 1]);
    let whole = AucBuckets::of(&probs, &labels);
    assert_eq!((&global.buckets.pos, &global.buckets.neg), (&whole.pos, &whole.neg));
    assert!(global.buckets.sums.iter().zip(&whole.sums).all(|(a, b)| (a - b).abs() < 1e-12));
    assert!((global.buckets.auc().unwrap() - 7.0 / 9.0).abs() < 1e-12);
    let refused = |e: ClientError| match e {
        ClientError::Refused { code, message, .. } => (code, message),
        other => panic!("expected a refusal, got {other}"),
    };
    let (code, m) = refused(tool.pass_auc(0, 1, &a).unwrap_err());
    assert!(code == ErrorCode::State && m.contains("a tool's"), "{m}");
    let (code, m) =
        refused(t0.pass_auc(0, 2, &AucBuckets { pos: vec![1; 3], neg: vec![0; 3], sums: [0.0; 3] }).unwrap_err());
    assert!(code == ErrorCode::Malformed && m.contains("3 and 3 buckets, not 4096"), "{m}");
    // Error sums no samples can make (a NaN, or beyond the sample count) would poison the
    // figures every trainer reads: refused.
    for sums in [[f64::NAN, 0.0, 0.0], [0.0, 0.0, 1e300], [3.0, 3.0, 0.0]] {
        let (code, m) = refused(t0.pass_auc(0, 2, &AucBuckets { sums, ..a.clone() }).unwrap_err());
        assert!(code == ErrorCode::Malformed && m.contains("error sums"), "{m}");
    }
    // Counts that would saturate the merged histogram (and make its MAE 2) are refused.
    let mut huge = AucBuckets::default();
    huge.pos[4095] = u64::MAX;
    let (code, m) = refused(t0.pass_auc(0, 2, &huge).unwrap_err());
    assert!(code == ErrorCode::Malformed && m.contains("(at most 281474976710656)"), "{m}");
    let (code, m) = refused(tool.global_auc(7).unwrap_err());
    assert!(code == ErrorCode::State && m.contains("pass 7"), "{m}");
}

/// On 2 servers x 2 trainers every trainer reads the same pass AUC over both trainers'
/// samples, and the launch summary reports it; its predicted and actual CTR are the trainers'
/// own figures (each exact over its samples) weighted by their samples, and its MAE and RMSE
/// are within what those predictions allow.
#[test]
fn a_launched_job_reports_the_pass_auc_over_every_trainer() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 3000, 0);
    let logs = dir.path().join("logs");
    let train = train.display().to_string();
    let (out, summary) = launch(&logs, &["--mode", "sync", "--train", &train, "--hidden", "8", "--passes", "2"]);
    assert!(out.contains("training figures over all 2 trainers' 6000 samples"), "{out}");
    assert!(out.contains(", COPC "), "{out}");
    let all = summary.train_auc_all_trainers.clone().expect("the summary has the pass AUC over all trainers");
    assert_eq!((all.trainers.clone(), all.samples), (vec![0, 1], 6000));
    let auc = all.auc.unwrap();
    assert!(auc > 0.5 && auc < 1.0, "{auc}");
    for r in &summary.reports {
        for p in &r.passes {
            let a = p.all_trainers.as_ref().unwrap();
            let first = &summary.reports[0].passes[p.pass as usize - 1];
            assert_eq!(Some(a), first.all_trainers.as_ref(), "trainer {} read the same figure", r.trainer);
            assert_eq!(a.samples, 6000);
            let e = a.errors.expect("error figures");
            let trains: Vec<_> = summary.reports.iter().map(|r| &r.passes[p.pass as usize - 1].train).collect();
            let weighted = |f: &dyn Fn(&(f64, f64)) -> f64| {
                trains.iter().map(|t| t.samples as f64 * f(&t.ctr.unwrap())).sum::<f64>() / 6000.0
            };
            assert!((e.predicted_ctr - weighted(&|c| c.0)).abs() < 1e-6, "{e:?} against {trains:?}");
            assert!((e.actual_ctr - weighted(&|c| c.1)).abs() < 1e-12, "{e:?} against {trains:?}");
            assert!((e.copc.unwrap() - e.actual_ctr / e.predicted_ctr).abs() < 1e-12);
            // |p - y| <= 1 and (p - y)^2 <= |p - y|; a model better than a coin is below 0.5.
            assert!(e.mae > 0.0 && e.rmse * e.rmse <= e.mae + 1e-12 && e.mae < 0.5, "{e:?}");
        }
    }
}
