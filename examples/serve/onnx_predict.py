#!/usr/bin/env python3
"""Score a data file with an `oar export` in onnxruntime, writing what `oar predict` writes.

    onnx_predict.py --export EXPORT --data FILE --out FILE [--graph model|dense] [--batch-size N]

One output line per input line: every head's score, tab-separated, in the heads' order (a
click probability, a regression value, or the true class's probability). The data lines are
read in the job's format as the export's manifest describes it (criteo, plain, slots,
multislot), with oar's id hashing, so the scores equal `oar predict`'s within float rounding.

`--graph model` (the default when the export has one) runs model.onnx, which takes each slot's
ids and looks them up itself; `--graph dense` looks the ids up in tables.safetensors with numpy
(an id without a row reads as zeros), pools the bags, and runs dense.onnx on the pooled rows:
the split a serving system with a key-value store makes.

Needs numpy, onnxruntime and safetensors (pip install numpy onnxruntime safetensors).
"""

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file

MASK = (1 << 64) - 1


def mix64(z):
    """oar's id mixer (SplitMix64's finalizer) on a Python int."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reverse_bits(x):
    return int("{:064b}".format(x)[::-1], 2)


def slot_id(slot, raw):
    """The id of raw id `raw` in slot `slot` (0-based) when slots are hashed."""
    return mix64(raw ^ reverse_bits(slot + 1))


def criteo_id(slot, value):
    """The id of Criteo categorical `value` (bytes) in slot `slot`."""
    if not value:
        key = (1 << 62) | slot
    elif len(value) == 8 and all(c in b"0123456789abcdefABCDEF" for c in value):
        key = ((slot + 1) << 32) | int(value, 16)
    else:
        h = 0xCBF29CE484222325
        for b in value:
            h = ((h ^ b) * 0x100000001B3) & MASK
        key = (1 << 63) | ((h ^ (slot << 48)) & ((1 << 62) - 1))
    return mix64(key)


class Sample:
    """One parsed line: labels, dense values, and per slot its ids and weights."""

    def __init__(self, labels, dense, bags):
        self.labels, self.dense, self.bags = labels, dense, bags


def number(text, what):
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{what} is not a finite number: {text!r}")
    return v


class Parser:
    def __init__(self, data):
        self.format = data["format"]
        self.labels = data["labels"]
        self.dense = data["dense"]
        self.dense_width = sum(c["width"] for c in self.dense)
        self.slots = data["slots"]
        self.hash = data["hash_slots"]
        self.fields = data.get("fields", [])
        self.pipe_command = data.get("pipe_command")

    def ident(self, slot, raw):
        return slot_id(slot, raw) if self.hash else raw

    def parse(self, line):
        return getattr(self, "parse_" + self.format)(line)

    def parse_criteo(self, line):
        fields = line.rstrip(b"\r").split(b"\t")
        fields += [b""] * (40 - len(fields))
        if len(fields) > 40 or fields[0] not in (b"0", b"1"):
            raise ValueError("not a Criteo line")
        dense = [math.log1p(max(int(f), 0)) if f else 0.0 for f in fields[1:14]]
        bags = [([criteo_id(s, fields[14 + s])], [1.0]) for s in range(26)]
        return Sample([float(fields[0])], dense, bags)

    def bag_item(self, slot, item, bag):
        raw, _, w = item.partition(b":")
        bag[0].append(self.ident(slot, int(raw)))
        bag[1].append(number(w, "weight") if w else 1.0)

    def parse_plain(self, line):
        cols = line.split()
        nl, nd = len(self.labels), self.dense_width
        if len(cols) != nl + nd + len(self.slots):
            raise ValueError(f"{nl + nd + len(self.slots)} columns expected, found {len(cols)}")
        values = [number(c, "a label or dense value") for c in cols[: nl + nd]]
        bags = []
        for s, col in enumerate(cols[nl + nd :]):
            bag = ([], [])
            if col != b"-":
                for item in col.split(b","):
                    self.bag_item(s, item, bag)
            bags.append(bag)
        return Sample(values[:nl], values[nl:], bags)

    def parse_slots(self, line):
        labels = [None] * len(self.labels)
        dense = {c["name"]: [] for c in self.dense}
        bags = [([], []) for _ in self.slots]
        slot_at = {n.encode(): i for i, n in enumerate(self.slots)}
        label_at = {n.encode(): i for i, n in enumerate(self.labels)}
        for token in line.split():
            name, _, value = token.partition(b":")
            if name in label_at:
                labels[label_at[name]] = number(value, "a label")
            elif name.decode() in dense:
                dense[name.decode()].append(number(value, "a dense value"))
            elif name in slot_at:
                self.bag_item(slot_at[name], value, bags[slot_at[name]])
        if any(v is None for v in labels):
            raise ValueError("a label is missing")
        values = []
        for c in self.dense:
            got = dense[c["name"]] or [0.0] * c["width"]
            if len(got) != c["width"]:
                raise ValueError(f"dense {c['name']} has {len(got)} values, not {c['width']}")
            values += got
        return Sample(labels, values, bags)

    def parse_multislot(self, line):
        tokens, at = line.split(), 0
        labels = [0.0] * len(self.labels)
        dense = {}
        bags = [([], []) for _ in self.slots]
        for name in self.fields:
            count = int(tokens[at])
            values = tokens[at + 1 : at + 1 + count]
            at += 1 + count
            if name in self.labels:
                labels[self.labels.index(name)] = number(values[0], "a label")
            elif name in self.slots:
                s = self.slots.index(name)
                for v in values:
                    bags[s][0].append(self.ident(s, int(v)))
                    bags[s][1].append(1.0)
            else:
                dense[name] = [number(v, "a dense value") for v in values]
        if at != len(tokens):
            raise ValueError("more values than the fields declare")
        flat = [v for c in self.dense for v in dense[c["name"]]]
        return Sample(labels, flat, bags)


def slot_arrays(samples, s):
    """Slot `s`'s ids (int64, bit-cast), weights and lengths, bags padded to the longest."""
    k = max(1, max(len(x.bags[s][0]) for x in samples))
    ids = np.zeros((len(samples), k), dtype=np.uint64)
    weights = np.zeros((len(samples), k), dtype=np.float32)
    lengths = np.zeros(len(samples), dtype=np.int64)
    for r, x in enumerate(samples):
        bag_ids, bag_weights = x.bags[s]
        ids[r, : len(bag_ids)] = bag_ids
        weights[r, : len(bag_ids)] = bag_weights
        lengths[r] = len(bag_ids)
    return ids.view(np.int64), weights, lengths


def ordered(rows, lengths, length):
    """A sequence embedding's input: each bag's last `length` rows in order, zero-padded after
    them, (N, length, D), and the mask of real positions (N, length)."""
    n = len(lengths)
    seq = np.zeros((n, length, rows.shape[2]), dtype=np.float32)
    mask = np.zeros((n, length), dtype=np.float32)
    for r in range(n):
        start = max(int(lengths[r]) - length, 0)
        kept = int(lengths[r]) - start
        seq[r, :kept] = rows[r, start : start + kept]
        mask[r, :kept] = 1.0
    return seq, mask


class Scorer:
    def __init__(self, export, graph):
        with open(os.path.join(export, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.parser = Parser(self.manifest["data"])
        self.slot_index = {n: i for i, n in enumerate(self.manifest["data"]["slots"])}
        complete = os.path.exists(os.path.join(export, "model.onnx"))
        self.graph = graph or ("model" if complete else "dense")
        if self.graph == "model" and not complete:
            sys.exit(f"{export} has no model.onnx ({self.manifest.get('model_skipped')}); use --graph dense")
        self.session = ort.InferenceSession(os.path.join(export, self.graph + ".onnx"))
        self.wanted = {i.name for i in self.session.get_inputs()}
        if self.graph == "dense":
            tensors = load_file(os.path.join(export, "tables.safetensors"))
            self.tables = {t["name"]: (tensors[t["name"] + ".ids"], tensors[t["name"] + ".weights"])
                           for t in self.manifest["tables"]}

    def lookup(self, table, ids):
        """Rows of `ids` (uint64) in `table`; an id without a row reads as zeros."""
        keys, weights = self.tables[table]
        at = np.searchsorted(keys, ids)
        at = np.minimum(at, len(keys) - 1) if len(keys) else at
        found = (keys[at] == ids) if len(keys) else np.zeros(ids.shape, dtype=bool)
        rows = np.zeros(ids.shape + (weights.shape[1],), dtype=np.float32)
        rows[found] = weights[at[found]]
        return rows

    def feeds(self, samples):
        feeds = {}
        if "dense" in self.wanted:
            feeds["dense"] = np.array([x.dense for x in samples], dtype=np.float32).reshape(len(samples), -1)
        if self.graph == "model":
            for s, name in enumerate(self.manifest["data"]["slots"]):
                if name + ".ids" in self.wanted:
                    ids, weights, lengths = slot_arrays(samples, s)
                    feeds.update({name + ".ids": ids, name + ".weights": weights, name + ".lengths": lengths})
            return feeds
        for e in self.manifest["embeddings"]:
            parts = []
            for j, slot in enumerate(e["slots"]):
                ids, weights, lengths = slot_arrays(samples, self.slot_index[slot])
                rows = self.lookup(e["table"], ids.view(np.uint64))
                if e.get("sequence"):
                    seq, mask = ordered(rows * weights[:, :, None], lengths, e["sequence"])
                    parts.append(seq)
                    if j == 0:
                        feeds[e["layer"] + ".mask"] = mask
                    continue
                pooled = (rows * weights[:, :, None]).sum(axis=1)
                n = np.maximum(lengths, 1).astype(np.float32)[:, None]
                if e["pooling"] == "mean":
                    pooled = pooled / n
                elif e["pooling"] == "sqrt_n":
                    pooled = pooled / np.sqrt(n)
                parts.append(pooled)
            axis = 2 if e.get("sequence") else 1
            feeds[e["layer"]] = np.concatenate(parts, axis=axis).reshape(len(samples), -1).astype(np.float32)
        return feeds

    def lines(self, samples):
        outputs = self.session.run([h["output"] for h in self.manifest["heads"]], self.feeds(samples))
        labels = self.manifest["data"]["labels"]
        columns = []
        for h, out in zip(self.manifest["heads"], outputs):
            if h["loss"] == "softmax":
                at = labels.index(h["label"])
                truth = np.array([int(x.labels[at]) for x in samples])
                columns.append(out[np.arange(len(samples)), truth])
            else:
                columns.append(out[:, 0])
        return ["\t".join(str(np.float32(c[r])) for c in columns) + "\n" for r in range(len(samples))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True, help="an `oar export` folder")
    ap.add_argument("--data", required=True, help="a data file in the job's format")
    ap.add_argument("--out", required=True, help="where the scores go")
    ap.add_argument("--graph", choices=["model", "dense"], help="model.onnx (default when present) or dense.onnx")
    ap.add_argument("--batch-size", type=int, default=1024)
    a = ap.parse_args()
    scorer = Scorer(a.export, a.graph)
    n = 0
    with open(a.data, "rb") as raw, open(a.out, "w") as out:
        # The job's pipe_command, if any, turns each file into data lines, as oar's reader does.
        pipe = None
        if scorer.parser.pipe_command:
            pipe = subprocess.Popen(["sh", "-c", scorer.parser.pipe_command], stdin=raw, stdout=subprocess.PIPE)
        f = pipe.stdout if pipe else raw
        batch = []
        for number_, line in enumerate(f, 1):
            line = line.rstrip(b"\n")
            try:
                batch.append(scorer.parser.parse(line))
            except (ValueError, IndexError) as e:
                sys.exit(f"{a.data}:{number_}: {e}")
            if len(batch) == a.batch_size:
                out.writelines(scorer.lines(batch))
                n, batch = n + len(batch), []
        if batch:
            out.writelines(scorer.lines(batch))
            n += len(batch)
        if pipe and pipe.wait() != 0:
            sys.exit(f"{a.data}: pipe_command exited with {pipe.returncode}")
    print(f"{n} lines of scores ({scorer.graph}.onnx) written to {a.out}")


if __name__ == "__main__":
    main()
