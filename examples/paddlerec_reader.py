# A pipe_command reader in PaddleRec's style (its rank/dnn readers): PaddleRec's slot-format
# lines (`click:0 dense_feature:0.1 .. 1:737395 ..`) on stdin, Paddle's MultiSlot text on stdout:
# per field in use_var order (click, slots 1..26, dense_feature), the number of values, then the
# values; an empty slot padded with 0, as PaddleRec pads it. Under Paddle it would subclass
# paddle.distributed.fleet.MultiSlotDataGenerator; here it subclasses oar's copy of that class
# (oar.data, from `pip install .`), or, in a Python without oar's package, the few lines of it
# this reader needs.
import sys

try:
    from oar.data import MultiSlotDataGenerator
except ImportError:

    class MultiSlotDataGenerator:
        def run_from_stdin(self):
            for line in sys.stdin:
                for sample in self.generate_sample(line)():
                    fields = ("%d %s" % (len(values), " ".join(map(str, values))) for _, values in sample)
                    sys.stdout.write(" ".join(fields) + "\n")


class Reader(MultiSlotDataGenerator):
    def __init__(self):
        super().__init__()
        self.sparse_slots = ["click"] + [str(i) for i in range(1, 27)]
        self.dense_slots = ["dense_feature"]
        self.slots = self.sparse_slots + self.dense_slots

    def generate_sample(self, line):
        def reader():
            values = {slot: [] for slot in self.slots}
            for token in line.split():
                name, value = token.split(":", 1)
                if name in values:
                    values[name].append(float(value) if name in self.dense_slots else int(value))
            yield [(slot, values[slot] or [0]) for slot in self.slots]

        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
