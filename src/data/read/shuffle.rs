//! Shuffling a trainer's lines within a pass (`[train] shuffle`, PaddlePaddle's
//! `InMemoryDataset.local_shuffle`, or a bounded window of it): click logs are written in time
//! order, and an unshuffled pass feeds batches of correlated samples, one hour's traffic after
//! another.
//!
//! A [`Shuffler`] holds raw lines, not parsed samples (a Criteo line is about 200 bytes, its
//! parsed sample several times that), and gives them back in an order that depends only on its
//! seed and the lines: a rejoining trainer that skips the samples it already pushed skips the
//! same ones again. With a window at least the share's line count it is a uniform permutation
//! of the whole share; with a smaller one, each line leaves at a uniformly drawn place of the
//! window once the window is full (what `tf.data`'s `shuffle(buffer_size)` does).
//! The lines held are bounded (`ShuffleConfig::max_bytes`: the trainer gives a third of the
//! memory the process may still take when the pass starts), and a share that does not fit is a
//! [`ShuffleError`], not an abort.

use crate::base::layout::mix64;

/// How a reader shuffles: the window and the seed of this trainer's pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShuffleConfig {
    /// Lines held at once; `u64::MAX`: the whole share.
    pub window: u64,
    /// The seed of this pass's order ([`pass_seed`]).
    pub seed: u64,
    /// Most bytes of lines held before reading stops with [`ShuffleError`].
    pub max_bytes: u64,
}

/// The seed of the order of `trainer`'s lines in `pass` of a job seeded `seed`: every pass a
/// different order, every trainer its own, the same on every run and every restart.
pub fn pass_seed(seed: u64, pass: u32, trainer: usize) -> u64 {
    mix64(mix64(seed ^ 0x5f0f_f1e5) ^ (u64::from(pass) << 32 | trainer as u64))
}

/// What a window of `window` lines holds, in words: "the whole share" or "N lines" (the
/// position record's order and the logs say it so).
pub fn window_text(window: u64) -> String {
    if window == u64::MAX {
        "the whole share".to_string()
    } else {
        format!("{window} lines")
    }
}

/// Lines held past the memory allowed to shuffling, or that the allocator refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "shuffling holds this trainer's lines in memory: with {held} lines ({mib} MiB) held, {why}; set \
     shuffle_window (--shuffle-window) to a number of lines, or use more trainers"
)]
pub struct ShuffleError {
    /// Lines held when the bound was reached.
    pub held: u64,
    /// Their bytes, in MiB.
    pub mib: u64,
    /// What stopped it: the bound, or the allocator refusing before it (a process limit or a
    /// machine short of memory since the bound was set).
    pub why: String,
}

/// A line as read: where it came from (for error messages) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLine {
    /// Index of its file in the reader's list.
    pub file: usize,
    /// Its 1-based line number in that file (or in its `pipe_command`'s output).
    pub number: u64,
    /// Bytes it took in the input, its line break included (for progress).
    pub bytes: u64,
    /// The text, without its line break.
    pub text: Box<[u8]>,
}

/// The memory a held text of `len` bytes takes: the allocator's 16-byte granules and header.
/// Counting the text alone let 5 million one-byte lines take 1.85 times what was counted.
fn text_cost(len: usize) -> u64 {
    if len == 0 {
        0
    } else {
        (len as u64).div_ceil(16) * 16 + 16
    }
}

/// The lines of a pass, given back in a seeded random order. Everything it holds is counted
/// (texts as the allocator rounds them, and the list's whole capacity) and allocated fallibly,
/// so a share that does not fit is [`ShuffleError`], not an abort.
#[derive(Debug)]
pub struct Shuffler {
    config: ShuffleConfig,
    held: Vec<HeldLine>,
    /// Bytes of the held texts ([`text_cost`]).
    text_bytes: u64,
    draws: u64,
}

impl Shuffler {
    /// An empty shuffler.
    pub fn new(config: ShuffleConfig) -> Shuffler {
        Shuffler { config, held: Vec::new(), text_bytes: 0, draws: 0 }
    }

    /// A uniform draw in `0..n` (`n > 0`), the next of this pass's counter-based stream.
    fn draw(&mut self, n: usize) -> usize {
        self.draws += 1;
        let r = mix64(self.config.seed.wrapping_add(self.draws.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        ((r as u128 * n as u128) >> 64) as usize
    }

    /// Bytes held: the texts and the list's capacity.
    pub fn held_bytes(&self) -> u64 {
        self.text_bytes + (self.held.capacity() * std::mem::size_of::<HeldLine>()) as u64
    }

    /// Lines held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no line is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn full(&self) -> ShuffleError {
        let limit_mib = self.config.max_bytes >> 20;
        self.stopped(format!("the next does not fit in the {limit_mib} MiB it may take"))
    }

    fn refused(&self) -> ShuffleError {
        self.stopped(
            "the allocator refused more memory (a process limit, or the machine's memory taken since the pass began)"
                .into(),
        )
    }

    fn stopped(&self, why: String) -> ShuffleError {
        ShuffleError { held: self.held.len() as u64, mib: self.held_bytes() >> 20, why }
    }

    /// Takes line `number` of file `file`, `bytes` long in the input, whose text is `text`;
    /// once the window is full, gives back one held line drawn at random, whose place the new
    /// line takes.
    pub fn push(
        &mut self,
        file: usize,
        number: u64,
        bytes: u64,
        text: &[u8],
    ) -> Result<Option<HeldLine>, ShuffleError> {
        let cost = text_cost(text.len());
        let filling = (self.held.len() as u64) < self.config.window;
        if filling && self.held.len() == self.held.capacity() {
            // The list doubles: its new capacity is counted before it is asked for.
            let room = (self.config.window - self.held.len() as u64).min(usize::MAX as u64) as usize;
            let more = self.held.capacity().max(1024).min(room);
            let list = (more * std::mem::size_of::<HeldLine>()) as u64;
            if self.held_bytes() + list + cost > self.config.max_bytes {
                return Err(self.full());
            }
            self.held.try_reserve_exact(more).map_err(|_| self.refused())?;
        }
        let i = if filling { None } else { Some(self.draw(self.held.len())) };
        let leaving = i.map_or(0, |i| text_cost(self.held[i].text.len()));
        if self.held_bytes() - leaving + cost > self.config.max_bytes {
            return Err(self.full());
        }
        let mut owned = Vec::new();
        owned.try_reserve_exact(text.len()).map_err(|_| self.refused())?;
        owned.extend_from_slice(text);
        let line = HeldLine { file, number, bytes, text: owned.into_boxed_slice() };
        self.text_bytes = self.text_bytes - leaving + cost;
        match i {
            None => {
                self.held.push(line);
                Ok(None)
            }
            Some(i) => Ok(Some(std::mem::replace(&mut self.held[i], line))),
        }
    }

    /// Gives back one of the lines still held, drawn at random; `None` when none is left.
    pub fn pop(&mut self) -> Option<HeldLine> {
        if self.held.is_empty() {
            return None;
        }
        let i = self.draw(self.held.len());
        let out = self.held.swap_remove(i);
        self.text_bytes -= text_cost(out.text.len());
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(s: &mut Shuffler, k: u64) -> Result<Option<HeldLine>, ShuffleError> {
        s.push(0, k, 2, k.to_string().as_bytes())
    }

    fn order(config: ShuffleConfig, n: u64) -> Vec<u64> {
        let mut s = Shuffler::new(config);
        let mut out = Vec::new();
        for k in 0..n {
            out.extend(push(&mut s, k).unwrap().map(|l| l.number));
        }
        out.extend(std::iter::from_fn(|| s.pop()).map(|l| l.number));
        out
    }

    fn config(window: u64, seed: u64) -> ShuffleConfig {
        ShuffleConfig { window, seed, max_bytes: u64::MAX }
    }

    #[test]
    fn a_whole_share_comes_back_once_each_in_an_order_set_by_the_seed() {
        let a = order(config(u64::MAX, 7), 1000);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "every line once");
        assert_eq!(a, order(config(u64::MAX, 7), 1000), "the same seed, the same order");
        assert_ne!(a, order(config(u64::MAX, 8), 1000), "another seed, another order");
        // Shuffled, not nearly sorted: most lines land far from their place in the file.
        let moved = a.iter().enumerate().filter(|(i, &k)| (*i as i64 - k as i64).abs() > 100).count();
        assert!(moved > 700, "{moved} of 1000 lines moved more than 100 places");
        // Where each of 4 quarters of the lines lands: every quarter reaches every quarter.
        for q in 0..4 {
            let places: Vec<usize> = (0..1000).filter(|i| a[*i] / 250 == q).collect();
            assert!((0..4).all(|p| places.iter().any(|i| i / 250 == p)), "quarter {q} lands everywhere");
        }
    }

    #[test]
    fn a_window_keeps_every_line_and_moves_each_within_its_reach() {
        let a = order(config(10, 3), 1000);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "every line once");
        // A line cannot leave before the window that holds it has filled up to it.
        assert!(a.iter().enumerate().all(|(i, &k)| k <= i as u64 + 10), "no line leaves before it was read");
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        // A window of one is the file's order.
        assert_eq!(order(config(1, 3), 50), (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn lines_past_the_memory_allowed_are_an_error_naming_the_window_setting() {
        let list = (1024 * std::mem::size_of::<HeldLine>()) as u64;
        // Room for the list and three one-digit lines (32 bytes each, as the allocator has them).
        let mut s = Shuffler::new(ShuffleConfig { window: u64::MAX, seed: 1, max_bytes: list + 3 * 32 });
        for k in 0..3 {
            assert_eq!(push(&mut s, k).unwrap(), None);
        }
        assert_eq!(s.held_bytes(), list + 3 * 32);
        let err = push(&mut s, 3).unwrap_err();
        assert_eq!(err.held, 3);
        assert!(err.to_string().contains("set shuffle_window (--shuffle-window)"), "{err}");
        // A list that must grow is counted at its new capacity before it is asked for.
        let err = push(&mut Shuffler::new(ShuffleConfig { window: 5000, seed: 1, max_bytes: list }), 0).unwrap_err();
        assert_eq!(err.held, 0);
        // A window smaller than that asks for its own size only.
        let small = (5 * std::mem::size_of::<HeldLine>()) as u64;
        assert!(push(&mut Shuffler::new(ShuffleConfig { window: 5, seed: 1, max_bytes: small + 32 }), 0).is_ok());
        // Within a window, a line replaced by a longer one is counted too: one that no longer
        // fits is refused, whatever the window.
        let two = (2 * std::mem::size_of::<HeldLine>()) as u64;
        let mut w = Shuffler::new(ShuffleConfig { window: 2, seed: 1, max_bytes: two + 2 * 32 });
        assert!((0..9).all(|k| push(&mut w, k).is_ok()), "one-digit lines replace one-digit lines");
        assert!(w.push(0, 9, 40, &[b'7'; 39]).is_err(), "a 39-byte line takes 64 bytes");
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn seeds_differ_by_pass_and_by_trainer() {
        let seeds = [pass_seed(1, 1, 0), pass_seed(1, 2, 0), pass_seed(1, 1, 1), pass_seed(2, 1, 0)];
        for i in 0..seeds.len() {
            for j in i + 1..seeds.len() {
                assert_ne!(seeds[i], seeds[j]);
            }
        }
        assert_eq!(pass_seed(1, 1, 0), pass_seed(1, 1, 0));
    }
}
