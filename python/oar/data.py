"""Readers in Python, as PaddlePaddle writes them.

:class:`MultiSlotDataGenerator` has the methods of Paddle's
``paddle.distributed.fleet.MultiSlotDataGenerator`` (``generate_sample``, ``generate_batch``,
``set_batch``, ``run_from_stdin``) and prints the same MultiSlot text, so a PaddleRec reader runs
on oar with only its import changed, and without Paddle installed:

* as a ``pipe_command`` of a job whose ``[data] format = "multislot"``
  (``pipe_command = "python reader.py"``): oar runs it as a process per data file, as Paddle did;
* in this process, ``reader.lines(files)`` gives the MultiSlot lines of data files (to score with
  ``oar.predict(model, lines=...)``, say).

As Paddle's class, it refuses a sample whose fields differ from the first sample's (names, count),
an empty field, and values that are not an ``int`` or a ``float`` (a string, a numpy integer), with a
``ValueError`` naming the field. ``strict=False`` lets empty fields through (oar's parser reads
them as empty bags, where Paddle asks readers to pad them).
"""

import sys


class MultiSlotDataGenerator:
    """A reader: override ``generate_sample(line)`` to return a function yielding samples, each
    a list of ``(field name, [values])`` in one fixed order."""

    def __init__(self, strict=True):
        self.strict = strict
        self.batch_size_ = 32
        self._fields = None

    def set_batch(self, batch_size):
        """Samples handed to ``generate_batch`` at a time."""
        self.batch_size_ = batch_size

    def generate_sample(self, line):
        """A function that yields the samples of one input line (to override)."""
        raise NotImplementedError("override generate_sample(line): return a function yielding samples")

    def generate_batch(self, samples):
        """A function that yields the samples of a batch to print (by default, as they are)."""

        def batch():
            yield from samples

        return batch

    def _text(self, sample):
        """One sample's MultiSlot line: per field, its number of values, then the values."""
        if not isinstance(sample, (list, tuple)):
            raise ValueError(f"a sample is a list or tuple of (name, values), not {type(sample).__name__}")
        if self._fields is None:
            self._fields = [name for name, _ in sample]
        elif len(sample) != len(self._fields):
            raise ValueError(f"a sample has {len(sample)} fields where the first had {len(self._fields)}")
        parts = []
        for (name, values), expected in zip(sample, self._fields):
            if not isinstance(name, str):
                raise ValueError(f"field name {name!r} is not a string")
            if name != expected:
                raise ValueError(f"field {name!r} where the first sample had {expected!r}")
            if not isinstance(values, (list, tuple)):
                raise ValueError(f"field {name!r}: its values are a list, not {type(values).__name__}")
            if not values and self.strict:
                raise ValueError(f"field {name!r} is empty: pad it in generate_sample (or strict=False)")
            for v in values:
                if not isinstance(v, (int, float)):
                    raise ValueError(f"field {name!r}: {v!r} is a {type(v).__name__}, not an int or a float")
            parts.append(" ".join([str(len(values)), *map(str, values)]))
        return " ".join(parts) + "\n"

    def multislot(self, lines):
        """The MultiSlot text of input ``lines``, a line (with its end) per sample, batch by batch."""
        batch = []
        for line in lines:
            for sample in self.generate_sample(line)():
                if sample is None:
                    continue
                batch.append(sample)
                if len(batch) == self.batch_size_:
                    yield from map(self._text, self.generate_batch(batch)())
                    batch = []
        if batch:
            yield from map(self._text, self.generate_batch(batch)())

    def run_from_stdin(self):
        """Reads lines from standard input and prints their samples (as a ``pipe_command``)."""
        for text in self.multislot(sys.stdin):
            sys.stdout.write(text)

    def lines(self, files):
        """The MultiSlot lines of data files, without their line ends."""
        if isinstance(files, str) or hasattr(files, "__fspath__"):
            files = [files]
        for path in files:
            with open(path) as f:
                for text in self.multislot(f):
                    yield text.rstrip("\n")
