//! Reading a job's data: listing and sharding files, opening them safely, `pipe_command`,
//! seeded shuffling, dense transforms, and the reader threads that turn lines into batches.

pub mod calendar;
pub mod files;
pub mod pipe;
pub mod reader;
pub mod shuffle;
mod sink;
pub mod transform;
