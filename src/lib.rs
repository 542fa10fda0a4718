//! oar: a parameter-server system for distributed training of recommendation models.
#![warn(missing_docs)]

pub mod layout;
pub mod table;
