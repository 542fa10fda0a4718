//! Peers that hold the job's secret (a leaked trainer credential, a buggy tool): what they
//! declare about their own requests is bounded before it touches any state. Each attack runs
//! against a real 2 x 2 sync job while its trainer 0 is stopped mid-pass; every attempt is
//! refused with a clear error, and the job's model is the undisturbed run's bit for bit.

use std::time::Duration;

use crate::security::{GuardedJob, JOB};
use crate::util::*;
use oar::auth::Secret;
use oar::client::{Client, ClientConfig, ClientError, StepHeader};
use oar::server::ServerStats;

/// Connects to `addrs` with the job's secret as trainer 0 (the real one is stopped, its
/// connections open).
fn insider(addrs: &[String], secret: &Secret) -> Client {
    let config = ClientConfig {
        secret: Some(secret.clone()),
        trainer: Some(0),
        ..ClientConfig::new(addrs.to_vec(), JOB, Duration::from_secs(5), Duration::from_secs(10))
    };
    let mut client = Client::connect(&config).unwrap();
    // Only the layout of the dense part matters to a push without one.
    use oar::table::{DenseSpec, Optimizer, TableSpec};
    let dense = DenseSpec { params: Vec::new(), block_size: 1, seed: 0, optimizer: Optimizer::sgd(0.1) };
    client.attach(&TableSpec { dense, sparse: Vec::new() });
    client
}

fn refusal(e: ClientError) -> String {
    match e {
        ClientError::Refused { message, .. } => message,
        other => panic!("expected a refusal, got {other}"),
    }
}

/// Numbers no trainer sends: a step far past the window (which would make the real steps
/// repeats), steps and passes near the top of their range, sample counts of no batch, a day end
/// from the far future (which would make every real day end a repeat).
#[test]
fn a_peer_with_the_secret_cannot_push_numbers_from_the_far_future_or_of_no_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 3000, 0);
    let secret_file = dir.path().join("secret");
    Secret::generate().write_new(&secret_file).unwrap();
    let secret = Secret::read(&secret_file).unwrap();
    let (attacked, clean) = (dir.path().join("attacked"), dir.path().join("clean"));
    std::fs::create_dir_all(&attacked).unwrap();
    std::fs::create_dir_all(&clean).unwrap();
    let refused = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = refused.clone();
    let attack = move |addrs: &[String]| {
        // A fresh connection each: a client that met a refusal does not read its other replies.
        let header =
            StepHeader { trainer: 0, step: 5, pass: 1, base_version: 0, samples: 200, apply: Default::default() };
        for (what, h) in [
            ("step 10^6", StepHeader { step: 1_000_000, ..header }),
            ("step 2^60", StepHeader { step: 1 << 60, ..header }),
            ("step u64::MAX", StepHeader { step: u64::MAX, ..header }),
            ("pass 2^31", StepHeader { pass: 1 << 31, ..header }),
            ("samples 2^64 - 1", StepHeader { samples: usize::MAX, ..header }),
            ("no sample", StepHeader { samples: 0, ..header }),
        ] {
            let m = refusal(insider(addrs, &secret).push(&h, None, &[]).unwrap_err());
            seen.lock().unwrap().push((what, m));
        }
        let m = refusal(insider(addrs, &secret).shrink_day_end(u32::MAX).unwrap_err());
        seen.lock().unwrap().push(("a day end after pass 2^32 - 1", m));
    };
    let stats = GuardedJob::new(&attacked, &train, &secret_file).run(Some(&attack));
    let undisturbed = GuardedJob::new(&clean, &train, &secret_file).run(None);
    let refused = refused.lock().unwrap().clone();
    let expected = [
        "trainer 0's push refused: step 1000000 is past this trainer's window: its step 5 is not handled yet",
        "step 1152921504606846976 is past this trainer's window",
        "step 18446744073709551615 is past this trainer's window",
        "it is of pass 2147483648, the trainers are in pass 1 at most",
        "18446744073709551615 samples: a batch holds 1 to 16777216",
        "0 samples: a batch holds 1 to 16777216",
        "a day end's shrink after pass 4294967295 refused: the trainers are in pass 1 at most",
    ];
    assert_eq!(refused.len(), expected.len());
    for ((what, message), e) in refused.iter().zip(expected) {
        assert!(message.contains(e), "{what}: {message}");
    }
    // Counted by the servers: the same updates, samples and rows as undisturbed, and the model
    // bit for bit.
    let work =
        |s: &[ServerStats]| s.iter().map(|s| (s.version, s.keys_pushed, s.applied_samples.clone())).collect::<Vec<_>>();
    assert_eq!(work(&stats), work(&undisturbed));
    assert_same_params(&load_params(&attacked.join("out")), &load_params(&clean.join("out")), 0.0);
}
