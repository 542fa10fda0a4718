#!/usr/bin/env python3
"""The reference (FuxiCTR 2.3.10) for examples/zoo/mmoe.toml, ple.toml and shared_bottom.toml (the
graph variant only) on UCI census-income,
two tasks (income over 50,000; never married), read as examples/readers/census.py reads them.

    run_multitask.py TRAIN TEST [--model mmoe ple] [--seed N ...] [--init library|oar|oar-emb|oar-dense]
                     [--variant graph|class]
    run_multitask.py --tasks DIR [--model ...] [--seed N ...] [--passes P]   # `oar gen tasks` lines, *_tasks.toml

TRAIN and TEST are raw UCI lines (oar's split: the first 8,000 and the last 2,000 lines of
census-income.test.first10k.txt.gz). Prints one line per (model, seed):
`MODEL init I seed N income X marital Y (T s)` (MODEL gets a `_class` suffix with --variant class).

Variants (see README.md):
  graph  (the matched one) oar's job-file graph from FuxiCTR's layers: `FeatureEmbedding` of the
         29 categorical columns (dim 4), concatenated with the 11 standardized numeric values
         (127 = 29 x 4 + 11, oar's `concat [emb, dense]`); MMoE = FuxiCTR's `MMoE_Layer` (8 experts
         MLP [16] ReLU, one linear gate per task, softmax); PLE = FuxiCTR's `CGC_Layer` x 2 (3
         experts per task + 1 shared, MLP [16] ReLU, linear gates, softmax) with the shared gate of
         the lower level over all 7 experts, as oar's ple.toml and the PLE paper (FuxiCTR's
         shared gate mixes only the shared experts: with one shared expert it is the identity);
         towers MLP [8] -> 1 ReLU.
  class  FuxiCTR's `MMoE` and `PLE` classes as shipped, the 11 values as FuxiCTR numeric fields
         (value x learned dim-4 vector), PLE's shared gate over the shared expert only.
With --tasks, DIR/train and DIR/test hold `oar gen tasks` lines (two labels, 100 dense values,
read unscaled, as examples/zoo/*_tasks.toml) and the graphs read the 100 values alone (no
embeddings), batch 256, `--passes` passes in file order (as `oar train --passes`); prints `task1` and
`task2` for income and marital.
Both: loss = sum of the two tasks' mean log-losses; Adagrad 0.05 (accumulator 0, eps 1e-10) on
the tables, Adam 1e-3 on the rest; batch 32 in file order, one pass (census; `--passes` with
--tasks); no dropout, batch norm or regularization.
"""
import argparse
import math
import os
import sys
import time
from collections import Counter, OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as ref  # noqa: E402  (inits, optimizers, COMMON)
from run_din import apply_init  # noqa: E402

ZOO = ref.ZOO
EMB = 4
BATCH = 32
# The columns as oar's reader splits them: the same module, so both sides read one definition.
sys.path.insert(0, os.path.join(HERE, "..", "..", "readers"))
from census import CATEGORICAL, INCOME, MARITAL, NAMES, NUMERIC  # noqa: E402,F401

LABELS = ["income", "marital"]


def parse(path):
    y, num, cat = [], [], []
    with open(path, encoding="latin-1") as fh:
        for line in fh:
            f = [x.strip() for x in line.rstrip("\n").split(",")]
            if f == [""]:
                continue
            assert len(f) == len(NAMES), f"{path}: {len(f)} fields"
            y.append([float(f[INCOME] == "50000+."), float(f[MARITAL] == "Never married")])
            num.append([float(f[i]) for i in NUMERIC])
            cat.append([f[i] for i in CATEGORICAL])
    return y, num, cat


def encode(train, test):
    """Numeric values standardized with the training lines' mean and population std (a std
    <= 1e-12 leaves the value unscaled), as src/data/transform.rs; every distinct (column, value)
    of the training lines its own index >= 1 (census.py hashes each value, oar's slot hashing
    keeps columns apart); index 0 a zero padding row, read by unseen test values (oar's
    evaluation reads an absent row as zeros)."""
    import numpy as np
    import torch

    ytr, ntr, ctr = parse(train)
    yte, nte, cte = parse(test)
    ntr, nte = np.asarray(ntr, np.float64), np.asarray(nte, np.float64)
    mean = ntr.mean(0)
    std = np.sqrt(np.maximum((ntr * ntr).mean(0) - mean * mean, 0.0))
    scale = np.where(std > 1e-12, 1.0 / np.where(std > 1e-12, std, 1.0), 1.0).astype(np.float32)
    ntr = (ntr.astype(np.float32) - mean.astype(np.float32)) * scale
    nte = (nte.astype(np.float32) - mean.astype(np.float32)) * scale
    vocab = []
    for s in range(len(CATEGORICAL)):
        counts = Counter(row[s] for row in ctr)
        words = sorted(counts.items(), key=lambda x: (-x[1], x[0]))
        vocab.append({w: i for i, (w, _) in enumerate(words, 1)})
    itr = np.array([[vocab[s][row[s]] for s in range(len(CATEGORICAL))] for row in ctr], np.int64)
    ite = np.array([[vocab[s].get(row[s], 0) for s in range(len(CATEGORICAL))] for row in cte], np.int64)
    t = lambda a, dt: torch.tensor(np.asarray(a), dtype=dt)
    return {
        "vocab_sizes": [len(v) + 1 for v in vocab],
        "train": (t(ytr, torch.float32), t(ntr, torch.float32), t(itr, torch.long)),
        "test": (t(yte, torch.float32), t(nte, torch.float32), t(ite, torch.long)),
        "unseen_test": int((ite == 0).sum()),
    }


def encode_tasks(folder):
    """`oar gen tasks` lines of DIR/train and DIR/test (part files in name order): two labels,
    then the dense values, which the *_tasks.toml jobs read unscaled; no categorical columns."""
    import numpy as np
    import torch

    def read(sub):
        rows = []
        for name in sorted(os.listdir(os.path.join(folder, sub))):
            if name.startswith("part-"):
                rows += [list(map(float, l.split())) for l in open(os.path.join(folder, sub, name)) if l.strip()]
        a = np.asarray(rows, np.float32)
        return torch.tensor(a[:, :2]), torch.tensor(a[:, 2:]), torch.zeros((len(a), 0), dtype=torch.long)

    return {"vocab_sizes": [], "train": read("train"), "test": read("test"), "unseen_test": 0}


def feature_map(vocab_sizes, numeric):
    from fuxictr.features import FeatureMap

    fm = FeatureMap("census_oar_reference", "/tmp")
    feats = OrderedDict()
    for s, c in enumerate(CATEGORICAL):
        feats[NAMES[c]] = {"source": "", "type": "categorical", "padding_idx": 0, "vocab_size": vocab_sizes[s]}
    if numeric:
        for c in NUMERIC:
            feats[NAMES[c]] = {"source": "", "type": "numeric"}
    fm.features = feats
    fm.labels = list(LABELS)
    fm.default_emb_dim = EMB
    fm.num_fields = fm.get_num_fields()
    fm.set_column_index()
    return fm


def inputs_of(num, ids, numeric):
    if ids.shape[1] == 0:  # oar gen tasks: no categorical columns
        return OrderedDict()
    X = OrderedDict((NAMES[c], ids[:, s]) for s, c in enumerate(CATEGORICAL))
    if numeric:
        for j, c in enumerate(NUMERIC):
            X[NAMES[c]] = num[:, j:j + 1]
    return X


def load(name, path):
    import importlib.util

    if not os.path.isdir(ZOO):
        sys.exit(f"FuxiCTR's model_zoo not found at {ZOO} (set FUXICTR_ZOO; see README.md)")
    spec = importlib.util.spec_from_file_location(name, os.path.join(ZOO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_graph(name, vocab_sizes, dense_width=0):
    """oar's job-file graph from FuxiCTR's layers; forward returns the two tasks' logits."""
    import torch
    from torch import nn
    from fuxictr.pytorch.layers import FeatureEmbedding, MLP_Block

    # 127 = 29 x 4 + 11 on census; the 100 dense values alone on `oar gen tasks` lines.
    width = len(CATEGORICAL) * EMB + len(NUMERIC) if vocab_sizes else dense_width
    mmoe_mod = load("fx_MMoE", "multitask/MMoE/src/MMoE.py")
    ple_mod = load("fx_PLE", "multitask/PLE/src/PLE.py")

    class CGC(ple_mod.CGC_Layer):
        """FuxiCTR's CGC_Layer; with `shared_over_all`, the shared gate mixes every expert (the
        tasks' then the shared ones, oar's `s1_experts` order), as the PLE paper's lower levels
        and oar's ple.toml; otherwise FuxiCTR's forward (shared gate over the shared experts)."""

        def __init__(self, input_dim, shared_over_all):
            super().__init__(num_shared_experts=1, num_specific_experts=3, num_tasks=2, input_dim=input_dim,
                             expert_hidden_units=[16], gate_hidden_units=[], hidden_activations="ReLU",
                             net_dropout=0, batch_norm=False)
            self.shared_over_all = shared_over_all
            if shared_over_all:
                self.gate[self.num_tasks] = MLP_Block(input_dim=input_dim, output_dim=2 * 3 + 1, hidden_units=[])

        def forward(self, x, require_gate=False):
            if not self.shared_over_all:
                return super().forward(x, require_gate)
            specific = [[e(x[i]) for e in self.specific_experts[i]] for i in range(self.num_tasks)]
            shared = [e(x[-1]) for e in self.shared_experts]
            outs = []
            for i in range(self.num_tasks + 1):
                stack = specific[i] + shared if i < self.num_tasks else sum(specific, []) + shared
                g = self.gate_activation(self.gate[i](x[i] if i < self.num_tasks else x[-1]))
                outs.append(torch.sum(g.unsqueeze(-1) * torch.stack(stack, dim=1), dim=1))
            return outs

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.name = name
            self.emb = FeatureEmbedding(feature_map(vocab_sizes, False), EMB) if vocab_sizes else None
            if name == "shared_bottom":
                # shared_bottom.toml: one shared MLP [128] (FuxiCTR's ShareBottom's bottom), towers [8].
                self.bottom = MLP_Block(width, hidden_units=[128])
            elif name == "mmoe":
                self.mmoe = mmoe_mod.MMoE_Layer(num_experts=8, num_tasks=2, input_dim=width,
                                                expert_hidden_units=[16], gate_hidden_units=[],
                                                hidden_activations="ReLU", net_dropout=0, batch_norm=False)
            else:
                self.levels = nn.ModuleList([CGC(width, True), CGC(16, False)])
            top = 128 if name == "shared_bottom" else 16
            self.towers = nn.ModuleList([MLP_Block(top, hidden_units=[8], output_dim=1) for _ in LABELS])

        def forward(self, X, num):
            x = num if self.emb is None else torch.cat([self.emb(X).flatten(1), num], 1)
            if self.name == "shared_bottom":
                h = [self.bottom(x)] * 2
            elif self.name == "mmoe":
                h = self.mmoe(x)
            else:
                h = [x, x, x]
                for level in self.levels:
                    h = level(h)
            return [tower(h[i]).view(-1) for i, tower in enumerate(self.towers)]

    return Graph()


def build_class(name, vocab_sizes):
    kw = dict(ref.COMMON)
    kw["loss"] = "binary_crossentropy"
    fmap = feature_map(vocab_sizes, True)
    common = dict(task=["binary_classification"] * 2, num_tasks=2, embedding_dim=EMB, expert_hidden_units=[16],
                  gate_hidden_units=[], tower_hidden_units=[8], hidden_activations="ReLU")
    if name == "mmoe":
        return load("fx_MMoE", "multitask/MMoE/src/MMoE.py").MMoE(fmap, num_experts=8, **common, **kw)
    return load("fx_PLE", "multitask/PLE/src/PLE.py").PLE(fmap, num_layers=2, num_shared_experts=1,
                                                          num_specific_experts=3, **common, **kw)


def run(name, variant, init, data, seed, batch=BATCH, passes=1):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(seed)
    np.random.seed(seed)
    cls = variant == "class"
    model = build_class(name, data["vocab_sizes"]) if cls else \
        build_graph(name, data["vocab_sizes"], data["train"][1].shape[1])
    apply_init(model, init, ref.oar_init)
    opts = ref.optimizers(model, 1e-3)

    def forward(num, ids):
        if cls:
            out = model(inputs_of(num, ids, True))
            return [out[f"{l}_pred"].view(-1) for l in LABELS]
        return model(inputs_of(num, ids, False), num)

    model.train()
    y, num, ids = data["train"]
    batches = [slice(s, s + batch) for s in range(0, len(y), batch)]  # file order, last batch partial
    for sl in batches * passes:
        outs = forward(num[sl], ids[sl])
        lossf = F.binary_cross_entropy if cls else F.binary_cross_entropy_with_logits
        loss = sum(lossf(o, y[sl, k]) for k, o in enumerate(outs))
        ref.step(opts, loss)
    model.eval()
    y, num, ids = data["test"]
    with torch.no_grad():
        outs = forward(num, ids)
    return [roc_auc_score(y[:, k].numpy(), o.numpy()) for k, o in enumerate(outs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train", nargs="?")
    ap.add_argument("test", nargs="?")
    ap.add_argument("--tasks", help="a folder of `oar gen tasks` (DIR/train, DIR/test) instead of census lines")
    ap.add_argument("--model", nargs="+", default=["mmoe", "ple"], choices=["mmoe", "ple", "shared_bottom"])
    ap.add_argument("--seed", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--init", default="library", choices=["library", "oar", "oar-emb", "oar-dense"])
    ap.add_argument("--variant", default="graph", choices=["graph", "class"])
    ap.add_argument("--passes", type=int, default=1, help="passes over DIR/train (--tasks only)")
    a = ap.parse_args()
    if a.passes != 1 and not a.tasks:
        ap.error("--passes is for --tasks only")
    import torch
    torch.set_num_threads(1)
    if a.tasks:
        data = encode_tasks(a.tasks)
        for m in a.model:
            for seed in a.seed:
                t = time.time()
                t1, t2 = run(m, a.variant, a.init, data, seed, 256, a.passes)
                print(f"{m} init {a.init} passes {a.passes} seed {seed} task1 {t1:.6f} task2 {t2:.6f} ({time.time() - t:.1f} s)", flush=True)
        return
    if not (a.train and a.test):
        ap.error("TRAIN and TEST (census lines) or --tasks DIR")
    data = encode(a.train, a.test)
    print(f"# {len(data['train'][0])} train / {len(data['test'][0])} test lines, "
          f"{sum(data['vocab_sizes']) - len(CATEGORICAL)} categorical ids, {data['unseen_test']} unseen test values",
          file=sys.stderr, flush=True)
    for m in a.model:
        for seed in a.seed:
            t = time.time()
            inc, mar = run(m, a.variant, a.init, data, seed)
            tag = m + ("_class" if a.variant == "class" else "")
            print(f"{tag} init {a.init} seed {seed} income {inc:.6f} marital {mar:.6f} ({time.time() - t:.1f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
