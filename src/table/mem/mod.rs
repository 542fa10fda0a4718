//! The memory machinery of the tables, and every `unsafe` block they have, each with its
//! safety note: pages from the kernel (huge pages where it has them), a pool of blocks cut from
//! them, rows stored in chunked slabs, and the open-addressing index from a sparse id to its row.
//! Of Paddle's rules these modules know only how many statistics a row carries
//! ([`STATS`](super::accessor::STATS)); the accessor, admission and the optimizers above decide
//! what a row holds and when it lives.

pub mod chunked;
pub mod index;
pub mod pages;
pub mod pool;
pub mod rows;
