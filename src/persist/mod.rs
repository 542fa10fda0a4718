//! What a job writes to disk and reads back: saved models (checkpoints and their manifests)
//! and the base and delta saves a serving system follows.

pub mod checkpoint;
pub mod export;
