#!/usr/bin/env python3
"""Trains oar's AutoInt+ graph (examples/zoo/autoint.toml) in PyTorch from the very values oar
drew, to tell a difference of training from a difference of start: if this script and
`oar train` score the same from the same start, oar trains as PyTorch does.

    oar train --config examples/zoo/autoint.toml --train DIR/train --test DIR/test --passes 1 \
        --seed S --batch-size 256 --threads 1 --dense-lr 1e-30 --sparse-lr 1e-30 --output START
    oar export --model START --out EXPORT
    same_start.py EXPORT DIR        # prints the test AUC after one pass at the job's rates
    same_start.py EXPORT DIR AFTER  # and how far each parameter is from AFTER: oar's export
                                    # after its own pass over DIR/train at the job's rates

The first run moves no value (a rate of 1e-30), so its save holds oar's initial values of every
row the training lines touch. This script reads them (dense.onnx's initializers,
tables.safetensors' rows), hashes each line's categorical values as oar does (onnx_predict.py's
criteo_id), and trains in file order at batch 256: Adagrad (lr 0.05, accumulator 0, eps 1e-10)
on the rows, Adam (1e-3) on the rest, as the job file. DIR holds `oar gen interactions` lines
(the 13 integer fields empty, so the dense input is zero). Needs onnx, onnxruntime (onnx_predict.py
imports it), safetensors, torch, scikit-learn.
"""
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from safetensors.numpy import load_file
from sklearn.metrics import roc_auc_score

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "serve"))
from onnx_predict import criteo_id  # noqa: E402

SLOTS, DENSE, HEADS, HEAD_DIM, BATCH = 26, 13, 2, 8, 256


def load(export):
    """Dense parameters by `layer.name` (several `deep.w`: kept in graph order) and the rows."""
    graph = onnx.load(os.path.join(export, "dense.onnx")).graph
    params = {}
    for t in graph.initializer:
        layer, _, rest = t.name.partition("/")
        name, _, number = rest.rpartition("_")  # "w_70": the graph's running number
        if name in ("w", "b") or name.startswith("w_"):
            value = torch.tensor(numpy_helper.to_array(t).copy())
            params.setdefault(f"{layer}.{name}", []).append((int(number), value))
    params = {k: [v for _, v in sorted(vs, key=lambda nv: nv[0])] for k, vs in params.items()}
    tables = load_file(os.path.join(export, "tables.safetensors"))
    return params, tables["v.ids"], tables["v.weights"]


def read(folder, index):
    labels, rows = [], []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            for line in f:
                fields = line.rstrip(b"\n").rstrip(b"\r").split(b"\t")
                labels.append(float(fields[0]))
                rows.append([index.get(criteo_id(s, fields[14 + s]), 0) for s in range(SLOTS)])
    return torch.tensor(labels), torch.tensor(rows)


def main():
    export, data = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    params, ids, weights = load(export)
    index = {int(i): k + 1 for k, i in enumerate(ids)}  # row 0: zeros, for an id without a row
    table = torch.tensor(np.concatenate([np.zeros((1, weights.shape[1]), np.float32), weights]), requires_grad=True)
    dense = [p.requires_grad_() for ps in params.values() for p in ps]
    p = {k: v[0] for k, v in params.items()}
    deep = list(zip(params["deep.w"], params["deep.b"]))

    def attention(x, layer):
        b, f, _ = x.shape
        q, k, v, r = (x @ p[f"{layer}.w_{n}"] for n in ("q", "k", "v", "residual"))
        q, k, v = (t.view(b, f, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        o = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return torch.relu(o.transpose(1, 2).reshape(b, f, HEADS * HEAD_DIM) + r)

    def forward(rows):
        e = table[rows]                                            # (B, 26, 10)
        zero = torch.zeros(len(rows), DENSE)
        fields = torch.cat([e, zero.unsqueeze(-1) * p["num.w"]], 1)  # weight_multiply of 0
        y = attention(attention(fields, "att1"), "att2").flatten(1) @ p["att_out.w"] + p["att_out.b"]
        h = torch.cat([e.flatten(1), zero], 1)
        for i, (w, b) in enumerate(deep):
            h = h @ w + b
            h = torch.relu(h) if i < len(deep) - 1 else h
        return (y + h).view(-1)

    sparse = torch.optim.Adagrad([table], lr=0.05, initial_accumulator_value=0.0, eps=1e-10)
    adam = torch.optim.Adam(dense, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    y, rows = read(os.path.join(data, "train"), index)
    for start in range(0, len(y), BATCH):
        loss = F.binary_cross_entropy_with_logits(forward(rows[start:start + BATCH]), y[start:start + BATCH])
        sparse.zero_grad()
        adam.zero_grad()
        loss.backward()
        sparse.step()
        adam.step()
    y, rows = read(os.path.join(data, "test"), index)
    with torch.no_grad():
        print(f"test AUC {roc_auc_score(y.numpy(), forward(rows).numpy()):.4f}")
    if len(sys.argv) > 3:
        oar, oar_ids, oar_weights = load(sys.argv[3])
        for name, values in params.items():
            for k, (mine, theirs) in enumerate(zip(values, oar[name])):
                diff = (mine.detach() - theirs).abs().max().item()
                print(f"{name}[{k}]: max |difference| {diff:.2e} (largest value {theirs.abs().max().item():.2e})")
        mine = table.detach().numpy()[[index[int(i)] for i in oar_ids]]
        diff = np.abs(mine - oar_weights)
        print(f"{len(oar_ids)} rows: max |difference| {diff.max():.2e}, median {np.median(diff):.2e}")


if __name__ == "__main__":
    main()
