//! A mini-batch of samples in columnar form, as readers produce it and models consume it.
//!
//! Each sample has `label_width` labels, `dense_width` dense values and `slots` bags of sparse
//! ids (multi-hot: a bag may hold any number of ids, each with an optional weight). The bags are
//! stored sample-major in CSR form: bag `k = sample * slots + slot` holds
//! `ids[offsets[k]..offsets[k + 1]]`. While every bag holds exactly one id, `offsets` stays
//! empty and bag `k` is simply `ids[k]`: one-hot data (Criteo) pays nothing for multi-hot, and
//! both go through the same [`Batch::bag`].

use std::ops::Range;

/// A mini-batch (see the module doc).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// `label_width` labels per sample.
    pub labels: Vec<f32>,
    /// Labels per sample (1, or one per head of a multi-task model).
    pub label_width: usize,
    /// Dense features, `dense_width` per sample.
    pub dense: Vec<f32>,
    /// Dense features per sample.
    pub dense_width: usize,
    /// Sparse bags per sample.
    pub slots: usize,
    /// The ids of every bag, bag after bag.
    pub ids: Vec<u64>,
    /// Bag boundaries (`rows * slots + 1` of them), or empty while every bag holds one id.
    pub offsets: Vec<u32>,
    /// One weight per id, or empty when every weight is 1.
    pub weights: Vec<f32>,
}

impl Batch {
    /// An empty batch of the given shape.
    pub fn new(label_width: usize, dense_width: usize, slots: usize) -> Batch {
        Batch { label_width, dense_width, slots, ..Batch::default() }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len() / self.label_width.max(1)
    }

    /// True if the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of bags so far.
    fn bags(&self) -> usize {
        if self.offsets.is_empty() {
            self.ids.len()
        } else {
            self.offsets.len() - 1
        }
    }

    /// The positions in `ids` of bag `k` (sample `k / slots`, slot `k % slots`).
    #[inline]
    pub fn bag(&self, k: usize) -> Range<usize> {
        if self.offsets.is_empty() {
            k..k + 1
        } else {
            self.offsets[k] as usize..self.offsets[k + 1] as usize
        }
    }

    /// The weight of the id at position `i` of `ids`.
    #[inline]
    pub fn weight(&self, i: usize) -> f32 {
        if self.weights.is_empty() {
            1.0
        } else {
            self.weights[i]
        }
    }

    /// The positions in `ids` of the bags of samples `rows`.
    pub fn id_range(&self, rows: Range<usize>) -> Range<usize> {
        let (a, b) = (rows.start * self.slots, rows.end * self.slots);
        if self.offsets.is_empty() {
            a..b
        } else {
            self.offsets[a] as usize..self.offsets[b] as usize
        }
    }

    /// Appends the next bag of the current sample (parsers push a sample's labels and dense
    /// values, then exactly `slots` bags). `weights`, if given, has one weight per id.
    pub fn push_bag(&mut self, ids: &[u64], weights: Option<&[f32]>) {
        if ids.len() != 1 && self.offsets.is_empty() {
            // The first bag that is not one id: switch to explicit boundaries.
            self.offsets = (0..=self.ids.len() as u32).collect();
        }
        if weights.is_some() && self.weights.is_empty() {
            self.weights = vec![1.0; self.ids.len()];
        }
        self.ids.extend_from_slice(ids);
        match weights {
            Some(w) => self.weights.extend_from_slice(w),
            None if !self.weights.is_empty() => self.weights.extend(std::iter::repeat_n(1.0, ids.len())),
            None => {}
        }
        if !self.offsets.is_empty() {
            self.offsets.push(self.ids.len() as u32);
        }
    }

    /// Keeps the first `rows` samples.
    pub fn truncate(&mut self, rows: usize) {
        if rows >= self.len() {
            return;
        }
        let ids = self.id_range(0..rows).end;
        self.labels.truncate(rows * self.label_width);
        self.dense.truncate(rows * self.dense_width);
        if !self.offsets.is_empty() {
            self.offsets.truncate(rows * self.slots + 1);
        }
        self.ids.truncate(ids);
        if !self.weights.is_empty() {
            self.weights.truncate(ids);
        }
    }

    /// Samples `rows` as a new batch.
    pub fn slice(&self, rows: Range<usize>) -> Batch {
        let ids = self.id_range(rows.clone());
        let (lw, dw, s) = (self.label_width, self.dense_width, self.slots);
        Batch {
            labels: self.labels[rows.start * lw..rows.end * lw].to_vec(),
            label_width: lw,
            dense: self.dense[rows.start * dw..rows.end * dw].to_vec(),
            dense_width: dw,
            slots: s,
            ids: self.ids[ids.clone()].to_vec(),
            offsets: if self.offsets.is_empty() {
                Vec::new()
            } else {
                self.offsets[rows.start * s..=rows.end * s].iter().map(|o| o - ids.start as u32).collect()
            },
            weights: if self.weights.is_empty() { Vec::new() } else { self.weights[ids].to_vec() },
        }
    }

    /// Appends all samples of `other` (same shape).
    pub fn extend(&mut self, other: &Batch) {
        self.labels.extend_from_slice(&other.labels);
        self.dense.extend_from_slice(&other.dense);
        for k in 0..other.bags() {
            let r = other.bag(k);
            let w = (!other.weights.is_empty()).then(|| &other.weights[r.clone()]);
            self.push_bag(&other.ids[r], w);
        }
    }

    /// Label `head` of every sample.
    pub fn label_column(&self, head: usize) -> impl Iterator<Item = f32> + '_ {
        self.labels.iter().skip(head).step_by(self.label_width.max(1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hot_bags_need_no_offsets_and_multi_hot_ones_switch_to_them() {
        let mut b = Batch::new(1, 0, 2);
        b.labels.push(1.0);
        b.push_bag(&[7], None);
        b.push_bag(&[8], None);
        assert!(b.offsets.is_empty());
        assert_eq!(b.bag(1), 1..2);
        b.labels.push(0.0);
        b.push_bag(&[9, 10, 11], Some(&[0.5, 1.0, 2.0]));
        b.push_bag(&[], None);
        assert_eq!(b.offsets, [0, 1, 2, 5, 5]);
        assert_eq!(b.weights, [1.0, 1.0, 0.5, 1.0, 2.0]);
        assert_eq!((b.bag(2), b.bag(3)), (2..5, 5..5));
        let tail = b.slice(1..2);
        assert_eq!(
            (tail.ids.clone(), tail.offsets.clone(), tail.weights.clone()),
            (vec![9, 10, 11], vec![0, 3, 3], vec![0.5, 1.0, 2.0])
        );
        let mut joined = b.slice(0..1);
        joined.extend(&tail);
        assert_eq!(joined, b);
        assert_eq!(b.id_range(1..2), 2..5);
        let mut cut = b.clone();
        cut.truncate(1);
        assert_eq!(
            (cut.labels.clone(), cut.ids.clone(), cut.offsets.clone(), cut.weights.clone()),
            (vec![1.0], vec![7, 8], vec![0, 1, 2], vec![1.0, 1.0])
        );
        cut.extend(&tail);
        assert_eq!(cut, b, "what is cut off can be put back");
    }
}
