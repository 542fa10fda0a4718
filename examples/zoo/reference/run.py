#!/usr/bin/env python3
"""An independent reference for oar's model zoo: FuxiCTR 2.3.10's model classes (and layers)
trained on the same real Criteo lines as examples/zoo/seeds.sh, with oar's settings.

    run.py MODEL [--split A|B ...] [--seed N ...] [--variant graph|class] [--init library|oar]
    run.py MODEL --data DIR [--batch 256] ...   # a generated set: DIR/train/part-*, DIR/test/part-*

MODEL is a zoo job name (lr, fm, wide_deep, deepfm, dcn, dcn_v2, dlrm, ffm, xdeepfm, autoint) or
dnn (examples/ctr_dnn.toml: an MLP over the concatenated embeddings and dense values).
Prints one line per (split, seed): `MODEL variant init split S seed N test AUC X`.

Variants (see README.md):
  graph  oar's job-file graph assembled from FuxiCTR's own layer classes (FeatureEmbedding,
         LogisticRegression, InnerProductInteraction, MLP_Block, CrossNet, CrossNetV2,
         CompressedInteractionNet, AutoInt's MultiHeadSelfAttention, FFM's interaction; DLRM is
         FuxiCTR's DLRM class unchanged, whose graph is oar's): the 13 standardized dense values
         enter where oar's file puts them.
  class  FuxiCTR's model class as shipped, with the 13 dense values as FuxiCTR numeric fields
         (each value times a learned dim-10 vector, FuxiCTR's way of feeding numbers).
Inits: `library` = FuxiCTR's (embeddings N(0, 1e-4), Linear/Conv1d xavier-normal, bias 0);
       `oar` = oar's (embeddings and weight_multiply U(+-0.05), weights and biases U(+-1/sqrt(fan-in)),
       cross biases 0); either way the layers the job file sets to `init = "zeros"` start at zero
       in the graph variant.

Data: ../shared/data/criteo/criteo_train_first10k.txt relative to the repository root (never copied).
"""
import argparse
import math
import os
import sys
import time
from collections import Counter, OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DATA = os.path.join(REPO, "..", "shared", "data", "criteo", "criteo_train_first10k.txt")
# FuxiCTR's model zoo is not in its PyPI wheel: point FUXICTR_ZOO at a checkout's model_zoo/.
ZOO = os.environ.get("FUXICTR_ZOO", "/tmp/fx_zoo/model_zoo")

DENSE, SLOTS = 13, 26
MODELS = ["dnn", "lr", "fm", "wide_deep", "deepfm", "dcn", "dcn_v2", "dlrm", "ffm", "xdeepfm", "autoint"]
# Adam learning rate of each job file's [dense_optimizer]; [sparse_optimizer] is Adagrad 0.05 in all.
DENSE_LR = {"lr": 1e-2, "fm": 1e-2, "ffm": 1e-2}
SPARSE_LR = 0.05
BATCH = 512
EMB = 10


# ---------------------------------------------------------------- data, as src/data/criteo.rs


def read_lines(path=DATA):
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def read_folder(folder):
    """The lines of a folder's part files in name order (oar's order for one trainer)."""
    lines = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            lines += read_lines(os.path.join(folder, name))
    return lines


def parse(lines):
    """labels, dense (ln(1 + max(x, 0)), empty -> 0), categorical strings (empty kept as '')."""
    labels, dense, cats = [], [], []
    for line in lines:
        line = line.rstrip(b"\r")
        f = line.split(b"\t")
        f += [b""] * (1 + DENSE + SLOTS - len(f))
        labels.append(1.0 if f[0] == b"1" else 0.0)
        dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in f[1:1 + DENSE]])
        cats.append([v.decode() for v in f[1 + DENSE:1 + DENSE + SLOTS]])
    return labels, dense, cats


def split_lines(lines, split):
    if split == "A":
        return lines[:9000], lines[-1000:]
    return lines[-9000:], lines[:1000]


def encode(train, test):
    """Tensors for one split. Every distinct (slot, value) of the training lines, the empty
    value included (oar gives "missing" its own id per slot), gets its own index >= 1; index 0
    is a padding row held at zero, which unseen test values read (oar's evaluation reads an
    absent row as zeros). Dense values are standardized with the training lines' mean and
    population std (a std <= 1e-12 leaves the value unscaled), as src/data/transform.rs."""
    import numpy as np
    import torch

    ytr, dtr, ctr = parse(train)
    yte, dte, cte = parse(test)
    dtr, dte = np.asarray(dtr, np.float64), np.asarray(dte, np.float64)
    mean = dtr.mean(0)
    std = np.sqrt(np.maximum((dtr * dtr).mean(0) - mean * mean, 0.0))
    scale = np.where(std > 1e-12, 1.0 / np.where(std > 1e-12, std, 1.0), 1.0)
    dtr = ((dtr.astype(np.float32) - mean.astype(np.float32)) * scale.astype(np.float32))
    dte = ((dte.astype(np.float32) - mean.astype(np.float32)) * scale.astype(np.float32))
    vocab = []
    for s in range(SLOTS):
        counts = Counter(row[s] for row in ctr)
        # FuxiCTR's Tokenizer order (count desc, then value); only the init draw depends on it.
        words = sorted(counts.items(), key=lambda x: (-x[1], x[0]))
        vocab.append({w: i for i, (w, _) in enumerate(words, 1)})
    itr = np.array([[vocab[s][row[s]] for s in range(SLOTS)] for row in ctr], np.int64)
    ite = np.array([[vocab[s].get(row[s], 0) for s in range(SLOTS)] for row in cte], np.int64)
    t = lambda a, dt: torch.tensor(np.asarray(a), dtype=dt)
    return {
        "vocab_sizes": [len(v) + 1 for v in vocab],
        "train": (t(ytr, torch.float32), t(dtr, torch.float32), t(itr, torch.long)),
        "test": (t(yte, torch.float32), t(dte, torch.float32), t(ite, torch.long)),
        "unseen_test": int((ite == 0).sum()),
    }


# ---------------------------------------------------------------- FuxiCTR feature map


def feature_map(vocab_sizes, numeric, emb_dim):
    from fuxictr.features import FeatureMap

    fm = FeatureMap("criteo_oar_reference", "/tmp")
    feats = OrderedDict()
    for s in range(SLOTS):
        feats[f"C{s + 1}"] = {"source": "", "type": "categorical", "padding_idx": 0,
                              "vocab_size": vocab_sizes[s]}
    if numeric:
        for j in range(DENSE):
            feats[f"I{j + 1}"] = {"source": "", "type": "numeric"}
    fm.features = feats
    fm.labels = ["label"]
    fm.default_emb_dim = emb_dim
    fm.num_fields = fm.get_num_fields()
    fm.set_column_index()
    return fm


def inputs_of(dense, ids, numeric):
    X = OrderedDict((f"C{s + 1}", ids[:, s]) for s in range(SLOTS))
    if numeric:
        for j in range(DENSE):
            X[f"I{j + 1}"] = dense[:, j:j + 1]  # (B, 1), as FuxiCTR's loaders
    return X


COMMON = dict(gpu=-1, verbose=0, model_root="/tmp/fx_reference_models", metrics=["AUC"],
              optimizer="adam", loss="binary_crossentropy", net_dropout=0, batch_norm=False)
# (regularizers: every class defaults to None, i.e. no regularization)


def import_zoo():
    if not os.path.isdir(ZOO):
        sys.exit(f"FuxiCTR's model_zoo not found at {ZOO} (set FUXICTR_ZOO; see README.md)")
    import importlib.util

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, os.path.join(ZOO, path))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return {
        "lr": load("fx_LR", "LR/src/LR.py").LR,
        "fm": load("fx_FM", "FM/src/FM.py").FM,
        "wide_deep": load("fx_WideDeep", "WideDeep/WideDeep_torch/src/WideDeep.py").WideDeep,
        "deepfm": load("fx_DeepFM", "DeepFM/DeepFM_torch/src/DeepFM.py").DeepFM,
        "dcn": load("fx_DCN", "DCN/DCN_torch/src/DCN.py").DCN,
        "dcn_v2": load("fx_DCNv2", "DCNv2/src/DCNv2.py").DCNv2,
        "dlrm": load("fx_DLRM", "DLRM/src/DLRM.py").DLRM,
        "ffm": load("fx_FFM", "FFM/src/FFM.py").FFM,
        "xdeepfm": load("fx_xDeepFM", "xDeepFM/src/xDeepFM.py").xDeepFM,
        "autoint_module": load("fx_AutoInt", "AutoInt/src/AutoInt.py"),
    }


# The hyper-parameters of each FuxiCTR class that reproduce the job file's sizes.
def class_kwargs(name):
    deep = [400, 400, 400]
    return {
        "lr": {},
        "fm": {"embedding_dim": EMB},
        "wide_deep": {"embedding_dim": EMB, "hidden_units": deep},
        "deepfm": {"embedding_dim": EMB, "hidden_units": deep},
        "dcn": {"embedding_dim": EMB, "dnn_hidden_units": deep, "num_cross_layers": 3},
        "dcn_v2": {"embedding_dim": EMB, "model_structure": "parallel", "use_low_rank_mixture": False,
                   "parallel_dnn_hidden_units": deep, "num_cross_layers": 3},
        "dlrm": {"embedding_dim": EMB, "bottom_mlp_units": [64], "top_mlp_units": [400, 400],
                 "interaction_op": "dot"},
        "ffm": {"embedding_dim": 4},
        "xdeepfm": {"embedding_dim": EMB, "dnn_hidden_units": deep, "cin_hidden_units": [32, 32]},
        "autoint": {"embedding_dim": EMB, "dnn_hidden_units": deep, "attention_layers": 2,
                    "num_heads": 2, "attention_dim": 16, "use_residual": True, "use_scale": False,
                    "layer_norm": False, "use_wide": False},
    }[name]


def build_class(name, zoo, fmap):
    """FuxiCTR's model class as shipped (its forward returns a probability)."""
    if name == "autoint":
        cls = zoo["autoint_module"].AutoInt
    else:
        cls = zoo[name]
    kw = dict(COMMON)
    kw.update(class_kwargs(name))
    return cls(fmap, **kw)


# ---------------------------------------------------------------- oar's graphs from FuxiCTR layers


def build_graph(name, zoo, vocab_sizes):
    """oar's job-file graph, built from FuxiCTR's layer classes; forward returns a logit."""
    import torch
    from torch import nn
    from fuxictr.pytorch.layers import (FeatureEmbedding, LogisticRegression, MLP_Block,
                                        InnerProductInteraction, CrossNet, CrossNetV2,
                                        CompressedInteractionNet)

    deep = [400, 400, 400]
    W = SLOTS * EMB + DENSE  # concat(emb, dense): 273

    def zero_linear(i, o):
        lin = nn.Linear(i, o)
        lin.zero_init = True  # init = "zeros" in the job file
        return lin

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.name = name
            cat = feature_map(vocab_sizes, False, EMB)
            self.numeric = False
            if name in ("lr", "fm", "wide_deep", "deepfm", "ffm", "xdeepfm"):
                self.wide = LogisticRegression(cat, use_bias=False)      # dim-1 table "w", summed
                self.lr_d = zero_linear(DENSE, 1)                           # lr_d, global bias
            if name in ("dnn", "fm", "wide_deep", "deepfm", "dcn", "dcn_v2", "xdeepfm"):
                self.emb = FeatureEmbedding(cat, EMB)
            if name in ("fm", "deepfm"):
                self.fm = InnerProductInteraction(SLOTS, output="product_sum")
            if name in ("dnn", "wide_deep", "deepfm", "xdeepfm"):
                self.deep = MLP_Block(W, hidden_units=deep, output_dim=1)
            if name == "xdeepfm":
                self.cin = CompressedInteractionNet(SLOTS, [32, 32], output_dim=1)
                self.cin.fc.zero_init = True                                # cin_out: init = "zeros"
            if name in ("dcn", "dcn_v2"):
                self.cross = CrossNet(W, 3) if name == "dcn" else CrossNetV2(W, 3)
                self.deep = MLP_Block(W, hidden_units=deep)
                self.fc = nn.Linear(W + deep[-1], 1)
            if name == "ffm":
                # FuxiCTR FFM's tables (F - 1 of K = 4) and its own interaction function
                self.ffm_emb = nn.ModuleList([FeatureEmbedding(feature_map(vocab_sizes, False, 4), 4)
                                              for _ in range(SLOTS - 1)])
                self.num_fields = SLOTS
                self.ffm_interaction = zoo["ffm"].ffm_interaction.__get__(self)
            if name == "autoint":
                mhsa = zoo["autoint_module"].MultiHeadSelfAttention
                fields = feature_map(vocab_sizes, True, EMB)             # 26 embeddings + 13 x W_k
                self.numeric = True
                self.emb = FeatureEmbedding(fields, EMB)
                self.att = nn.Sequential(
                    mhsa(EMB, attention_dim=16, num_heads=2, use_residual=True, use_scale=False),
                    mhsa(16, attention_dim=16, num_heads=2, use_residual=True, use_scale=False))
                # oar's self_attention always projects the residual (X W_r); FuxiCTR's only when
                # the widths differ: give the second layer its projection too.
                self.att[1].W_res = nn.Linear(16, 16, bias=False)
                self.att_out = nn.Linear((SLOTS + DENSE) * 16, 1)
                self.deep = MLP_Block(W, hidden_units=deep, output_dim=1)

        def forward(self, X, dense):
            n = self.name
            if n == "autoint":
                e = self.emb(X)                                             # (B, 39, 10)
                att = self.att(e).flatten(1)
                x = torch.cat([e[:, :SLOTS].flatten(1), dense], 1)
                return self.att_out(att) + self.deep(x)
            if n == "dnn":
                return self.deep(torch.cat([self.emb(X, flatten_emb=True), dense], 1))
            if n in ("dcn", "dcn_v2"):
                x0 = torch.cat([self.emb(X, flatten_emb=True), dense], 1)
                return self.fc(torch.cat([self.cross(x0), self.deep(x0)], 1))
            y = self.wide(X) + self.lr_d(dense)
            if n == "lr":
                return y
            if n == "ffm":
                return y + self.ffm_interaction([m(X) for m in self.ffm_emb])
            e = self.emb(X)                                                 # (B, 26, 10)
            if n in ("fm", "deepfm"):
                y = y + self.fm(e)
            if n == "xdeepfm":
                y = y + self.cin(e)
            if n in ("wide_deep", "deepfm", "xdeepfm"):
                y = y + self.deep(torch.cat([e.flatten(1), dense], 1))
            return y

    return Graph()


# ---------------------------------------------------------------- inits and optimizers


def library_init(model):
    """FuxiCTR's BaseModel.reset_parameters (xavier-normal Linear/Conv1d, zero bias), then the
    modules' own init_weights (embeddings N(0, 1e-4), padding row zero)."""
    from torch import nn

    def default(m):
        if type(m) in [nn.Linear, nn.Conv1d]:
            nn.init.xavier_normal_(m.weight)
            if m.bias is not None:
                m.bias.data.fill_(0)

    def custom(m):
        if hasattr(m, "init_weights"):
            m.init_weights()

    model.apply(default)
    model.apply(custom)


def oar_init(model):
    """oar's initializers: embedding rows and weight_multiply vectors U(+-0.05) (src/model/config.rs
    embedding_init, weight_multiply.rs), other weights and biases U(+-1/sqrt(fan-in)) (dense.rs,
    cin.rs, attention.rs), cross-layer biases 0 (cross.rs)."""
    import torch
    from torch import nn
    from fuxictr.pytorch.layers import FeatureEmbeddingDict, CrossNetV2

    with torch.no_grad():
        numeric_linears = set()
        for m in model.modules():
            if isinstance(m, FeatureEmbeddingDict):
                for sub in m.embedding_layers.values():
                    if isinstance(sub, nn.Embedding):
                        sub.weight.uniform_(-0.05, 0.05)
                        if sub.padding_idx is not None:
                            sub.weight[sub.padding_idx].zero_()
                    elif isinstance(sub, nn.Linear):
                        sub.weight.uniform_(-0.05, 0.05)
                        numeric_linears.add(id(sub))
        for m in model.modules():
            if type(m) in (nn.Linear, nn.Conv1d) and id(m) not in numeric_linears:
                fan_in = m.weight.shape[1] * (m.weight.shape[2] if m.weight.dim() == 3 else 1)
                b = 1.0 / math.sqrt(fan_in)
                m.weight.uniform_(-b, b)
                if m.bias is not None:
                    m.bias.uniform_(-b, b)
            if isinstance(m, CrossNetV2):
                for lin in m.cross_layers:
                    lin.bias.zero_()
            if type(m).__name__ == "CrossInteraction":
                m.bias.zero_()


def zero_marked(model):
    import torch
    with torch.no_grad():
        for m in model.modules():
            if getattr(m, "zero_init", False):
                m.weight.zero_()
                if m.bias is not None:
                    m.bias.zero_()


def step(opts, loss):
    """One update: every optimizer's gradients cleared, `loss` backpropagated, every optimizer stepped."""
    for o in opts:
        o.zero_grad()
    loss.backward()
    for o in opts:
        o.step()


def optimizers(model, dense_lr):
    """Adagrad (lr 0.05, initial accumulator 0, eps 1e-10, PyTorch's) on every nn.Embedding
    table; Adam (betas 0.9/0.999, eps 1e-8) with the job file's lr on everything else, as oar's
    dense parameters. A job file's Adagrad has eps 1e-8 unless it sets one (src/table/optim.rs,
    `Optimizer::defaults`); autoint.toml sets 1e-10: its rows start at N(0, 1e-4), and 1e-8
    damped the first steps of rows whose gradient was near it (same_start.py). The other job
    files keep 1e-8 against this 1e-10: with 1e-10 none of their 5-seed means on the real lines
    moves by more than 0.0006 (seeds.sh, 2026-11-29)."""
    import torch
    from torch import nn

    sparse, seen = [], set()
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    sparse.append(p)
    dense = [p for p in model.parameters() if id(p) not in seen and p.requires_grad]
    adam = torch.optim.Adam(dense, lr=dense_lr, betas=(0.9, 0.999), eps=1e-8)
    if not sparse:  # a model without tables (oar gen tasks' dense inputs)
        return [adam]
    return [torch.optim.Adagrad(sparse, lr=SPARSE_LR, initial_accumulator_value=0.0, eps=1e-10), adam]


# ---------------------------------------------------------------- one run


def run(name, variant, init, data, seed, zoo, batch=BATCH, passes=1):
    """The test AUC after each of `passes` passes over the training lines (each in file order)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(seed)
    np.random.seed(seed)
    if variant == "class" or name == "dlrm":
        # DLRM: FuxiCTR's class feeds the raw dense values to its bottom MLP, as oar's graph.
        fmap = feature_map(data["vocab_sizes"], True, 4 if name == "ffm" else EMB)
        model = build_class(name, zoo, fmap)
        numeric = True
        prob_out = True
    else:
        model = build_graph(name, zoo, data["vocab_sizes"])
        numeric = model.numeric
        prob_out = False
    if init == "library":
        library_init(model)
    else:
        oar_init(model)
    if variant == "graph" or name == "dlrm":
        zero_marked(model)
    opts = optimizers(model, DENSE_LR.get(name, 1e-3))
    aucs = []
    for _ in range(passes):
        model.train()
        y, d, ids = data["train"]
        for start in range(0, len(y), batch):  # file order, last batch partial, as oar reads
            sl = slice(start, start + batch)
            out = model(inputs_of(d[sl], ids[sl], numeric), d[sl]) if not prob_out else \
                model(inputs_of(d[sl], ids[sl], numeric))["y_pred"]
            out = out.view(-1)
            loss = F.binary_cross_entropy(out, y[sl]) if prob_out else \
                F.binary_cross_entropy_with_logits(out, y[sl])
            step(opts, loss)
        model.eval()
        y, d, ids = data["test"]
        with torch.no_grad():
            out = model(inputs_of(d, ids, numeric), d) if not prob_out else \
                model(inputs_of(d, ids, numeric))["y_pred"]
        aucs.append(roc_auc_score(y.numpy(), out.view(-1).numpy()))
    return aucs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--split", nargs="+", default=["A", "B"], choices=["A", "B"])
    ap.add_argument("--seed", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--variant", default="graph", choices=["graph", "class"])
    ap.add_argument("--init", default="library", choices=["library", "oar"])
    ap.add_argument("--data", help="a generated set (oar gen interactions): DIR/train and DIR/test")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--passes", type=int, default=1, help="passes over DIR/train (--data only); prints each pass's AUC")
    a = ap.parse_args()
    if a.model == "dnn" and a.variant == "class":
        ap.error("dnn has no FuxiCTR class: it is the graph variant only")
    if a.data:
        import torch
        torch.set_num_threads(1)
        zoo = import_zoo()
        data = encode(read_folder(os.path.join(a.data, "train")), read_folder(os.path.join(a.data, "test")))
        for seed in a.seed:
            t = time.time()
            aucs = run(a.model, a.variant, a.init, data, seed, zoo, a.batch, a.passes)
            each = "".join(f" pass {k + 1} {v:.6f}" for k, v in enumerate(aucs)) if a.passes > 1 else ""
            print(f"{a.model} {a.variant} {a.init} {a.data} seed {seed} test AUC {aucs[-1]:.6f}{each} "
                  f"({time.time() - t:.1f} s)", flush=True)
        return
    if not os.path.isfile(DATA):
        print(f"skipped: {os.path.normpath(DATA)} is absent")
        return
    import torch
    torch.set_num_threads(1)
    zoo = import_zoo()
    lines = read_lines()
    for split in a.split:
        data = encode(*split_lines(lines, split))
        for seed in a.seed:
            t = time.time()
            auc = run(a.model, a.variant, a.init, data, seed, zoo)[0]
            print(f"{a.model} {a.variant} {a.init} split {split} seed {seed} test AUC {auc:.6f} "
                  f"({time.time() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
