//! The memory machinery of the tables, and every `unsafe` block they have, each with its
//! safety note: pages from the kernel (huge pages where it has them), a pool of blocks cut from
//! them, rows stored in chunked slabs, and the open-addressing index from a sparse id to its row.
//! Nothing here knows Paddle's rules: the layer above (accessor, admission, optimizers) decides
//! what a row holds and when it lives.

pub mod chunked;
pub mod index;
pub mod pages;
pub mod pool;
pub mod rows;

// The old parent of these files, until their paths move (rows reads the accessor's layout).
use super::accessor;
