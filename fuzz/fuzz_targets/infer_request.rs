//! Any bytes as the body of an `oar serve` infer request: parsed, then turned into a batch of a
//! Criteo model's data and of a multi-hot plain-format model's. Nothing may panic; every refusal
//! is an error message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar::data::{DataConfig, Format, Schema};
use oar::serve::v2::{batch, InferRequest};

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<InferRequest>(data) else { return };
    let _ = batch(&req, &Schema::criteo(), &[true; 26]);
    let plain = DataConfig {
        format: Format::Plain,
        labels: Some(vec!["y".into()]),
        slots: Some(vec!["a".into(), "b".into()]),
        dense: Some(vec![oar::data::DenseColumn { name: "x".into(), width: 2 }]),
        hash_slots: Some(true),
        ..Default::default()
    };
    let schema = Schema::resolve(&plain, None).expect("a valid schema");
    let _ = batch(&req, &schema, &[true, false]);
});
