#!/usr/bin/env python3
"""The reference (FuxiCTR 2.3.10) for examples/zoo/esmm.toml and esmm_base.toml on lines in
PaddleRec's Ali-CCP format (`id,click,ctcvr,field:id,...`, as `oar gen conversions` writes them).
FuxiCTR 2.3.10 has no ESMM class, so both are oar's job-file graphs from FuxiCTR's layers:

  esmm       `FeatureEmbedding` (dim 12) of each field, the job's 23 fields flattened (fields
             absent from a line are empty bags: zeros, as oar's sum pooling of nothing), a CTR
             tower and a CVR tower `MLP_Block` [256, 64] -> 1 ReLU; pCTCVR = pCTR x pCVR; loss =
             click log-loss + CTCVR log-loss.
  esmm_base  the same embeddings and one `MLP_Block` [256, 64] -> 1 on the CTCVR label alone.

    run_esmm.py DIR [--model esmm esmm_base] [--seed N ...] [--init library|oar] [--batch-size 256]

DIR holds train/part-* and test/part-* (sorted, as oar reads a folder). Prints one line per
(model, seed): `MODEL init I seed N ctcvr AUC X (T s)`. Adagrad 0.05 (accumulator 0, eps 1e-10)
on the tables, Adam 1e-3 on the rest; batches in file order, one pass; exact AUC on the test
lines' CTCVR labels. Every distinct (field, id) of the training lines has its own row; unseen
test ids read the zero row 0.
"""
import argparse
import glob
import os
import sys
import time
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as ref  # noqa: E402  (inits, optimizers, COMMON)
from run_din import apply_init  # noqa: E402

EMB = 12
# esmm.toml's slots, in its order.
FIELDS = ["101", "109_14", "110_14", "127_14", "150_14", "121", "122", "124", "125", "126", "127", "128",
          "129", "205", "206", "207", "210", "216", "508", "509", "702", "853", "301"]


def read_dir(d):
    files = sorted(glob.glob(os.path.join(d, "part-*")))
    if not files:
        sys.exit(f"no part-* files in {d}")
    rows = []
    for f in files:
        with open(f) as fh:
            for line in fh:
                p = line.rstrip("\n").split(",")
                if len(p) < 3:
                    continue
                feats = {}
                for tok in p[3:]:
                    field, value = tok.split(":")
                    assert field not in feats, f"{f}: one id per field expected, got two for {field}"
                    feats[field] = value
                rows.append((float(p[1]), float(p[2]), feats))
    return rows


def encode(train, test):
    import torch

    present = sorted({f for _, _, feats in train for f in feats}, key=FIELDS.index)
    vocab = {f: {} for f in present}
    for _, _, feats in train:
        for f, v in feats.items():
            vocab[f].setdefault(v, len(vocab[f]) + 1)

    def tensors(rows):
        ids = torch.zeros(len(rows), len(present), dtype=torch.long)
        for r, (_, _, feats) in enumerate(rows):
            for j, f in enumerate(present):
                ids[r, j] = vocab[f].get(feats.get(f), 0)
        y = torch.tensor([[c, v] for c, v, _ in rows])
        return ids, y

    return {"present": present, "vocab_sizes": [len(vocab[f]) + 1 for f in present],
            "train": tensors(train), "test": tensors(test)}


def build(name, data):
    import torch
    from torch import nn
    from fuxictr.features import FeatureMap
    from fuxictr.pytorch.layers import FeatureEmbedding, MLP_Block

    fm = FeatureMap("esmm_oar_reference", "/tmp")
    fm.features = OrderedDict((f, {"source": "", "type": "categorical", "padding_idx": 0, "vocab_size": n})
                              for f, n in zip(data["present"], data["vocab_sizes"]))
    fm.labels = ["click", "ctcvr"]
    fm.default_emb_dim = EMB
    fm.num_fields = fm.get_num_fields()
    fm.set_column_index()
    width = len(FIELDS) * EMB  # the job's 23 fields; absent ones are zeros
    absent = (len(FIELDS) - len(data["present"])) * EMB

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = FeatureEmbedding(fm, EMB)
            towers = ["ctr", "cvr"] if name == "esmm" else ["ctcvr"]
            self.towers = nn.ModuleDict({t: MLP_Block(width, hidden_units=[256, 64], output_dim=1) for t in towers})

        def forward(self, ids):
            X = OrderedDict((f, ids[:, j]) for j, f in enumerate(data["present"]))
            e = self.emb(X).flatten(1)
            x = torch.cat([e, torch.zeros(e.shape[0], absent)], 1)
            if name == "esmm":
                ctr = self.towers["ctr"](x).view(-1)
                cvr = self.towers["cvr"](x).view(-1)
                return ctr, torch.sigmoid(ctr) * torch.sigmoid(cvr)
            return None, torch.sigmoid(self.towers["ctcvr"](x).view(-1))

    return Graph()


def run(name, init, data, seed, batch):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(seed)
    np.random.seed(seed)
    model = build(name, data)
    apply_init(model, init, ref.oar_init)
    opts = ref.optimizers(model, 1e-3)
    model.train()
    ids, y = data["train"]
    for start in range(0, len(y), batch):  # file order, one pass, last batch partial
        sl = slice(start, start + batch)
        ctr, ctcvr = model(ids[sl])
        loss = F.binary_cross_entropy(ctcvr.clamp(1e-7, 1 - 1e-7), y[sl, 1])
        if ctr is not None:
            loss = loss + F.binary_cross_entropy_with_logits(ctr, y[sl, 0])
        ref.step(opts, loss)
    model.eval()
    ids, y = data["test"]
    with torch.no_grad():
        _, p = model(ids)
    return roc_auc_score(y[:, 1].numpy(), p.numpy())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--model", nargs="+", default=["esmm", "esmm_base"], choices=["esmm", "esmm_base"])
    ap.add_argument("--seed", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--init", default="library", choices=["library", "oar"])
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    data = encode(read_dir(os.path.join(a.dir, "train")), read_dir(os.path.join(a.dir, "test")))
    print(f"# {len(data['train'][1])} train / {len(data['test'][1])} test lines, fields {data['present']}",
          file=sys.stderr, flush=True)
    for m in a.model:
        for seed in a.seed:
            t = time.time()
            auc = run(m, a.init, data, seed, a.batch_size)
            print(f"{m} init {a.init} seed {seed} ctcvr AUC {auc:.6f} ({time.time() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
