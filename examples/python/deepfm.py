"""DeepFM in Paddle or PyTorch with its embeddings on oar's tables: SERVERS oar servers, TRAINERS
trainer processes, async, on Criteo-format files (label, 13 integers, 26 hex ids, tab-separated).

The network is PaddleRec's DeepFM (models/rank/deepfm/net.py: a first-order term, the FM term
over the 26 slots' vectors and 13 dense-feature vectors, an MLP over the same vectors), written
here in each framework; with --paddlerec DIR (a PaddleRec checkout) Paddle runs PaddleRec's own
net.py, its two paddle.nn.Embedding layers swapped for oar's and nothing else changed. The
dense parameters live on the servers too (their Adam), the tables use Adagrad.

    python examples/python/deepfm.py --train DIR/train --test DIR/test --framework paddle

prints (and with --out writes) the test AUC, log-loss and samples/s of the training passes.
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import oar

SLOTS, DENSE = 26, 13


def read_criteo(files, limit=None):
    """Labels, ln(1+x) dense features (missing and negative: 0) and u64 ids as int64 bits
    (slot in the high bits; a missing id is 0, the padding) of Criteo-format files."""
    import pandas as pd

    names = ["label"] + [f"I{i}" for i in range(1, DENSE + 1)] + [f"C{i}" for i in range(1, SLOTS + 1)]
    frames = [pd.read_csv(f, sep="\t", header=None, names=names, dtype=str, nrows=limit) for f in files]
    df = pd.concat(frames, ignore_index=True)
    labels = df["label"].astype(np.float32).to_numpy()
    ints = df[names[1:DENSE + 1]].astype(np.float64).fillna(0.0).to_numpy()
    dense = np.log1p(np.maximum(ints, 0.0)).astype(np.float32)
    ids = np.zeros((len(df), SLOTS), dtype=np.int64)
    for s in range(SLOTS):
        values = df[f"C{s + 1}"].fillna("").map(lambda h: int(h, 16) if h else -1).to_numpy(dtype=np.int64)
        ids[:, s] = np.where(values < 0, 0, ((s + 1) << 32) | np.maximum(values, 0))
    return labels, dense, ids


def files_of(folder):
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))


def auc(labels, scores):
    """Area under the ROC curve (ties given half)."""
    import pandas as pd

    ranks = pd.Series(scores).rank().to_numpy()
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def spec(dense_entries, dim):
    init = {"kind": "normal", "std": 0.1 / math.sqrt(dim)}  # PaddleRec's TruncatedNormal scale
    return {
        "tables": [{"name": "v", "dim": dim, "init": init}, {"name": "w", "dim": 1, "init": init}],
        "dense": dense_entries,
        "sparse_optimizer": {"kind": "adagrad", "lr": 0.05},
        "dense_optimizer": {"kind": "adam", "lr": 1e-3},
    }


class PaddleNet:
    """The network in Paddle: PaddleRec's own (with --paddlerec) or the same layers here."""

    def __init__(self, args, seed):
        import paddle

        import oar.paddle

        paddle.seed(seed)
        self.paddle = paddle
        if args.paddlerec:
            sys.path.insert(0, str(Path(args.paddlerec) / "models/rank/deepfm"))
            import net

            self.model = net.DeepFMLayer(1000001, args.dim, DENSE, SLOTS, args.hidden)
        else:
            self.model = self.own(args)
        self.swap = lambda tables: oar.paddle.swap_embeddings(
            self.model, tables, {"fm.embedding_one": "w", "fm.embedding": "v"}
        )
        self.dense_spec = oar.paddle.dense_spec
        self.ServerDense = oar.paddle.ServerDense

    def own(self, args):
        paddle = self.paddle
        nn = paddle.nn
        dim = args.dim
        std = 0.1 / math.sqrt(dim)

        class FM(nn.Layer):
            def __init__(self):
                super().__init__()
                self.embedding_one = nn.Embedding(2, 1, padding_idx=0)
                self.embedding = nn.Embedding(2, dim, padding_idx=0)
                normal = paddle.nn.initializer.TruncatedNormal(std=std)
                self.dense_w_one = self.create_parameter([DENSE], default_initializer=normal)
                self.dense_w = self.create_parameter([1, DENSE, dim], default_initializer=normal)

            def forward(self, ids, x):
                first = self.embedding_one(ids).sum(1) + (x * self.dense_w_one).sum(1, keepdim=True)
                feats = paddle.concat([self.embedding(ids), x.unsqueeze(2) * self.dense_w], 1)
                second = 0.5 * (feats.sum(1).square() - feats.square().sum(1)).sum(1, keepdim=True)
                return first, second, feats

        class DeepFM(nn.Layer):
            def __init__(self):
                super().__init__()
                self.fm = FM()
                sizes = [dim * (SLOTS + DENSE)] + list(args.hidden) + [1]
                layers = []
                for i in range(len(sizes) - 1):
                    init = paddle.nn.initializer.Normal(std=1.0 / math.sqrt(sizes[i]))
                    layers.append(nn.Linear(sizes[i], sizes[i + 1], weight_attr=paddle.ParamAttr(initializer=init)))
                    if i < len(sizes) - 2:
                        layers.append(nn.ReLU())
                self.dnn = nn.Sequential(*layers)

            def forward(self, sparse, x):
                ids = paddle.concat(sparse, axis=1)
                first, second, feats = self.fm(ids, x)
                deep = self.dnn(feats.reshape([-1, dim * (SLOTS + DENSE)]))
                return paddle.nn.functional.sigmoid(first + second + deep)

        return DeepFM()

    def forward(self, ids, x):
        p = self.paddle
        sparse = [p.to_tensor(ids[:, s:s + 1]) for s in range(SLOTS)]
        return self.model(sparse, p.to_tensor(x)).reshape([-1])

    def loss(self, pred, y):
        y = self.paddle.to_tensor(y).reshape([-1, 1])
        return self.paddle.nn.functional.log_loss(pred.reshape([-1, 1]), y).mean()

    def no_grad(self):
        return self.paddle.no_grad()


class TorchNet:
    """The same network in PyTorch."""

    def __init__(self, args, seed):
        import torch

        import oar.torch

        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.torch, self.args = torch, args
        dim, nn = args.dim, torch.nn
        sizes = [dim * (SLOTS + DENSE)] + list(args.hidden) + [1]
        layers = []
        for i in range(len(sizes) - 1):
            linear = nn.Linear(sizes[i], sizes[i + 1])
            nn.init.normal_(linear.weight, std=1.0 / math.sqrt(sizes[i]))
            layers += [linear] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
        self.model = nn.ModuleDict(
            {
                "dnn": nn.Sequential(*layers),
                "fm": nn.ParameterDict(
                    {
                        "dense_w_one": nn.Parameter(torch.randn(DENSE) * 0.1 / math.sqrt(dim)),
                        "dense_w": nn.Parameter(torch.randn(1, DENSE, dim) * 0.1 / math.sqrt(dim)),
                    }
                ),
            }
        )
        self.dense_spec = oar.torch.dense_spec
        self.ServerDense = oar.torch.ServerDense
        self.embeddings = None

        def swap(tables):
            self.embeddings = (oar.torch.Embedding(tables, "w", padding_idx=0), oar.torch.Embedding(tables, "v", padding_idx=0))

        self.swap = swap

    def forward(self, ids, x):
        t = self.torch
        ids, x = t.from_numpy(ids), t.from_numpy(x)
        one, vec = self.embeddings
        fm = self.model["fm"]
        first = one(ids).sum(1) + (x * fm["dense_w_one"]).sum(1, keepdim=True)
        feats = t.cat([vec(ids), x.unsqueeze(2) * fm["dense_w"]], 1)
        second = 0.5 * (feats.sum(1).square() - feats.square().sum(1)).sum(1, keepdim=True)
        deep = self.model["dnn"](feats.reshape(len(ids), -1))
        return t.sigmoid(first + second + deep).reshape(-1)

    def loss(self, pred, y):
        return self.torch.nn.functional.binary_cross_entropy(pred, self.torch.from_numpy(y))

    def no_grad(self):
        return self.torch.no_grad()


def trainer(args):
    """One trainer: its share of the training files, then (trainer 0) the test set."""
    files = files_of(args.train)[args.rank::args.trainers]
    labels, ints, ids = read_criteo(files, args.lines)
    mean, std = ints.mean(0), ints.std(0) + 1e-6
    net = (PaddleNet if args.framework == "paddle" else TorchNet)(args, args.seed)
    # The servers keep the network's dense parameters (its embeddings' aside) and the tables.
    entries = net.dense_spec(net.model)
    tables = oar.Tables(
        args.addresses.split(","), spec(entries, args.dim), trainer=args.rank, job="deepfm", secret_file=args.credential
    )
    net.swap(tables)
    dense = net.ServerDense(net.model, tables)
    x_all = (ints - mean) / std
    rng = np.random.default_rng(args.seed + args.rank)
    tables.barrier()
    start = time.monotonic()
    for _ in range(args.passes):
        order = rng.permutation(len(labels))
        for b in range(0, len(order), args.batch_size):
            rows = order[b:b + args.batch_size]
            y = labels[rows]
            with tables.step(y):
                dense.pull()
                loss = net.loss(net.forward(ids[rows], x_all[rows]), y)
                loss.backward()
                dense.push()
        tables.end_pass()
    seconds = time.monotonic() - start
    tables.barrier()  # every trainer done: the model is final
    result = {"trainer": args.rank, "samples": int(len(labels) * args.passes), "seconds": seconds}
    if args.rank == 0:
        t_labels, t_ints, t_ids = read_criteo(files_of(args.test))
        dense.pull()
        scores = []
        with net.no_grad():
            for b in range(0, len(t_labels), 4096):
                p = net.forward(t_ids[b:b + 4096], ((t_ints[b:b + 4096] - mean) / std).astype(np.float32))
                scores.append(np.asarray(p.numpy(), dtype=np.float64))
        s = np.clip(np.concatenate(scores), 1e-7, 1 - 1e-7)
        result["auc"] = auc(t_labels, s)
        result["logloss"] = float(-np.mean(t_labels * np.log(s) + (1 - t_labels) * np.log(1 - s)))
        stats = tables.stats()
        result["applied_samples"] = [st["applied_samples"] for st in stats]
        result["discarded_samples"] = [st["discarded_samples"] for st in stats]
    tables.close()
    print("OAR_RESULT " + json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--framework", choices=["paddle", "torch"], default="paddle")
    p.add_argument("--paddlerec", help="a PaddleRec checkout: run its models/rank/deepfm/net.py")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--dim", type=int, default=9)
    p.add_argument("--hidden", type=lambda s: [int(v) for v in s.split(",")], default=[400, 400, 400])
    p.add_argument("--lines", type=int, help="at most this many lines of each training file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the result as JSON here")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--addresses", help=argparse.SUPPRESS)
    p.add_argument("--credential", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return trainer(args)
    with oar.Servers(args.servers, trainers=args.trainers, mode="async", job="deepfm") as servers:
        procs = []
        for r in range(args.trainers):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--rank", str(r)]
            cmd += ["--addresses", ",".join(servers.addresses), "--credential", str(servers.credential(r))]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        results = []
        for r, proc in enumerate(procs):
            out, _ = proc.communicate()
            if proc.returncode != 0:
                sys.exit(f"trainer {r} failed (exit status {proc.returncode})")
            results += [json.loads(line[len("OAR_RESULT "):]) for line in out.splitlines() if line.startswith("OAR_RESULT ")]
        servers.wait(120)
    first = next(r for r in results if r["trainer"] == 0)
    samples = sum(r["samples"] for r in results)
    summary = {
        "framework": args.framework + (" (PaddleRec net.py)" if args.paddlerec else ""),
        "seed": args.seed,
        "auc": first["auc"],
        "logloss": first["logloss"],
        "samples_per_s": samples / max(r["seconds"] for r in results),
        "trained_samples": samples,
        "applied_samples": first["applied_samples"],
        "discarded_samples": first["discarded_samples"],
    }
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
