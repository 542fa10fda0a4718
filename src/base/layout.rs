//! Where every parameter lives: which server owns a sparse id, which server owns a dense block,
//! which in-server stripe holds an id. Pure functions shared by the client (to route requests)
//! and the server (to know what it owns), so both sides can never disagree.
//!
//! - [`server_of_row`]: the server of an id of a table, from the high bits of the id mixed with
//!   its table's salt. Each table has its own salt, so the same id in two tables is two rows that
//!   may live on different servers, and a small id that every table has does not load one server
//!   with all of them; table 0 is unsalted, so models saved before there were several tables keep
//!   their layout.
//! - [`stripe_of`]: the stripe ([`STRIPES`] of them) of a server's table that holds an id, from
//!   the low bits of the mixed id. The server uses the high bits and the stripe the low bits, so
//!   the two choices are independent: every server spreads its ids evenly over all its stripes.
//! - [`DenseLayout`]: the flat dense vector cut into fixed-size blocks dealt round-robin to the
//!   servers, so even one large weight matrix is spread over every server.
//! - [`group_positions`] (and [`group_by_server`], its use for ids): a counting sort of a batch's
//!   positions by owner into reused buffers, so routing a batch costs two linear passes.
//! - [`MAX_PEERS`]: the most trainers, and the most servers, one job may have.

use std::ops::Range;

/// Most trainers, and most servers, one job may have: far above any cluster's (PaddlePaddle's
/// largest parameter-server jobs run hundreds to a few thousand), and a bound on what a typo
/// or a hostile environment variable can make a server allocate per trainer.
pub const MAX_PEERS: usize = 1 << 16;

/// The 64-bit finalizer of splitmix64: a cheap bijective mixer with good avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The server (0..num_servers) that owns sparse id `id`.
#[inline]
pub fn server_of_id(id: u64, num_servers: usize) -> usize {
    // Multiply-shift maps the mixed id uniformly onto 0..n without a division.
    ((mix64(id) as u128 * num_servers as u128) >> 64) as usize
}

/// Number of lock stripes inside one server's sparse table (a power of two).
pub const STRIPES: usize = 64;

/// The stripe (0..STRIPES) of one server's table that holds `id`.
#[inline]
pub fn stripe_of(id: u64) -> usize {
    (mix64(id) as usize) & (STRIPES - 1)
}

/// How the flat dense parameter vector is cut into blocks and dealt to servers round-robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseLayout {
    /// Total number of dense floats in the model.
    pub total: usize,
    /// Floats per block (the last block may be shorter).
    pub block_size: usize,
    /// Number of servers the blocks are dealt to.
    pub num_servers: usize,
}

impl DenseLayout {
    /// Number of blocks the dense vector is cut into.
    pub fn num_blocks(&self) -> usize {
        self.total.div_ceil(self.block_size)
    }

    /// The server that owns block `b`.
    pub fn server_of_block(&self, b: usize) -> usize {
        b % self.num_servers
    }

    /// Range of the flat dense vector covered by block `b`.
    pub fn block_range(&self, b: usize) -> Range<usize> {
        let start = b * self.block_size;
        start..(start + self.block_size).min(self.total)
    }

    /// The blocks owned by `server`, in increasing order.
    pub fn blocks_of(&self, server: usize) -> impl Iterator<Item = usize> + '_ {
        (server..self.num_blocks()).step_by(self.num_servers)
    }

    /// Number of dense floats owned by `server`.
    pub fn len_of(&self, server: usize) -> usize {
        self.blocks_of(server).map(|b| self.block_range(b).len()).sum()
    }
}

/// The server that owns id `id` of sparse table `table`. Each table's ids are placed by their
/// own hash (table 0's as [`server_of_id`], so models saved before several tables existed keep
/// their layout), so a small id that every table has does not load one server with all of them.
#[inline]
pub fn server_of_row(table: u32, id: u64, num_servers: usize) -> usize {
    let salt = if table == 0 { 0 } else { mix64(0x7ab1_e000 + table as u64) };
    server_of_id(id ^ salt, num_servers)
}

/// Groups positions `0..ids.len()` by the server that owns each id of `table` (see
/// [`group_positions`]).
pub fn group_by_server(table: u32, ids: &[u64], num_servers: usize, order: &mut Vec<u32>, starts: &mut Vec<usize>) {
    if num_servers == 1 {
        // Every id is the one server's, in the batch's own order: no id is hashed.
        order.clear();
        order.extend(0..ids.len() as u32);
        starts.clear();
        starts.extend([0, ids.len()]);
        return;
    }
    group_positions(ids.len(), num_servers, |i| server_of_row(table, ids[i], num_servers), order, starts);
}

/// Groups positions `0..len` by `group_of(position)` (each below `groups`): `order` lists the
/// positions group by group, keeping their relative order, and `starts[g]..starts[g+1]` is group
/// `g`'s part of `order`. A counting sort, so routing a batch costs two linear passes.
pub fn group_positions(
    len: usize,
    groups: usize,
    group_of: impl Fn(usize) -> usize,
    order: &mut Vec<u32>,
    starts: &mut Vec<usize>,
) {
    // `group_of` is cheap (a few bit operations on a precomputed hash), so it is called twice
    // rather than stored: no allocation per batch.
    starts.clear();
    starts.resize(groups + 1, 0);
    for i in 0..len {
        starts[group_of(i) + 1] += 1;
    }
    for g in 0..groups {
        starts[g + 1] += starts[g];
    }
    order.clear();
    order.resize(len, 0);
    // `starts[g]` serves as group g's cursor, ending at g + 1's start: shifted back after.
    for i in 0..len {
        let g = group_of(i);
        order[starts[g]] = i as u32;
        starts[g] += 1;
    }
    starts.copy_within(..groups, 1);
    starts[0] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_400_by_400_weight_spans_every_server() {
        let layout = DenseLayout { total: 160_000, block_size: 8192, num_servers: 3 };
        for s in 0..3 {
            assert!(layout.len_of(s) > 0, "server {s} owns no block");
        }
        let sum: usize = (0..3).map(|s| layout.len_of(s)).sum();
        assert_eq!(sum, 160_000);
    }

    #[test]
    fn ids_spread_evenly_over_servers_and_stripes() {
        let mut per_server = [0usize; 3];
        let mut per_stripe = [0usize; STRIPES];
        for id in 0..30_000u64 {
            per_server[server_of_id(id, 3)] += 1;
            per_stripe[stripe_of(id)] += 1;
        }
        for c in per_server {
            assert!((9_000..11_000).contains(&c), "{per_server:?}");
        }
        assert!(per_stripe.iter().all(|&c| c > 300));
    }

    #[test]
    fn tables_place_the_same_id_independently_and_table_0_as_before() {
        let moved = (0..1000u64).filter(|&id| server_of_row(1, id, 4) != server_of_row(2, id, 4)).count();
        assert!(moved > 600, "{moved} of 1000 ids differ between tables 1 and 2");
        assert!((0..1000u64).all(|id| server_of_row(0, id, 4) == server_of_id(id, 4)));
    }

    #[test]
    fn grouping_keeps_every_position_once() {
        let ids: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
        let (mut order, mut starts) = (Vec::new(), Vec::new());
        group_by_server(0, &ids, 4, &mut order, &mut starts);
        let mut seen = order.clone();
        seen.sort();
        assert_eq!(seen, (0..1000).collect::<Vec<u32>>());
        for s in 0..4 {
            for &p in &order[starts[s]..starts[s + 1]] {
                assert_eq!(server_of_id(ids[p as usize], 4), s);
            }
        }
        // One server: the batch's own order, as the general grouping gives it.
        let (mut general, mut general_starts) = (Vec::new(), Vec::new());
        group_positions(ids.len(), 1, |i| server_of_row(3, ids[i], 1), &mut general, &mut general_starts);
        group_by_server(3, &ids, 1, &mut order, &mut starts);
        assert_eq!((order, starts), (general, general_starts));
    }
}
