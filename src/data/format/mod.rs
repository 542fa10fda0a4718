//! The line formats oar reads: Criteo TSV, plain columns, PaddleRec's slots and Paddle's
//! MultiSlot text, each a parser of one line into a batch.

pub mod criteo;
pub mod multislot;
pub mod plain;
pub mod slots;
