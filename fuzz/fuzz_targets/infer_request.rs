//! Any bytes as the body of an `oar serve` infer request: parsed (as JSON alone, and with the
//! binary tensor extension, its first two bytes saying where the JSON ends), then turned into a
//! batch of a Criteo model's data and of a multi-hot plain-format model's, and the outputs asked
//! for checked. Nothing may panic; every refusal is an error message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar::data::{DataConfig, Format, Schema};
use oar::serve::v2::{batch, parse, wanted, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse(data, None) {
        check(&req);
    }
    if let [a, b, body @ ..] = data {
        let header_len = (u16::from_le_bytes([*a, *b]) as usize).to_string();
        if let Ok(req) = parse(body, Some(&header_len)) {
            check(&req);
        }
    }
});

fn check(req: &Request) {
    let _ = wanted(&req.head, &["click".to_string(), "ctr".to_string()]);
    let _ = batch(req, &Schema::criteo(), &[true; 26]);
    let plain = DataConfig {
        format: Format::Plain,
        labels: Some(vec!["y".into()]),
        slots: Some(vec!["a".into(), "b".into()]),
        dense: Some(vec![oar::data::DenseColumn { name: "x".into(), width: 2 }]),
        hash_slots: Some(true),
        ..Default::default()
    };
    let schema = Schema::resolve(&plain, None).expect("a valid schema");
    let _ = batch(req, &schema, &[true, false]);
}
