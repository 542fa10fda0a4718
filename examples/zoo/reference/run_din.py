#!/usr/bin/env python3
"""The reference (FuxiCTR 2.3.10) for examples/zoo/din.toml, din_base.toml, dien.toml, dien_aux.toml and
bst_din_format.toml: FuxiCTR's `DIN` class, its `DNN` class (the history mean-pooled by FuxiCTR's
`MaskedAveragePooling`), its `DIEN` class, and BST as oar's graph from FuxiCTR's and torch's layers
(`bst`; `bst_class` is FuxiCTR's `BST` class as shipped, for information), sized and trained as
oar's job files, on the lines of `oar gen sequences` (PaddleRec's DIN format,
`hist_items;hist_cates;target_item;target_cate;label`, histories oldest first).
`din_dice` is DIN with FuxiCTR's Dice in the attention unit. `dien_aux` is the `DIEN` class with
its auxiliary loss (alpha 1, aux MLP [100, 50] ReLU) on the negatives dien_aux.toml's
`pipe_command` samples (run here on each training file, as oar runs it); the loss is FuxiCTR's
terms reduced as oar's `next_item_loss` reduces them (per sample, the mean over its real pairs of
the positive's and the negative's log-loss; then the batch mean), because FuxiCTR 2.3.10's
`DIEN.add_loss` fails as shipped: `pad_mask[:, 1:].view(-1, 1)` raises on the non-contiguous
slice, and past that its per-pair terms are never reduced to the scalar loss.

    run_din.py DIR [--model din din_dice din_base dien dien_aux bst bst_class] [--seed N ...] [--init library|oar|oar-emb|oar-dense] [--batch-size 256]

DIR holds train/part-* and test/part-* (read in sorted order, as oar reads a folder). Prints one
line per (model, seed): `MODEL init I seed N test AUC X (T s)`.

Matched (see README.md): embedding dim 8; item and category ids each in one table shared by the
candidate and the history (oar keeps both in one table: the ids are disjoint, so one table or two
is the same function and the same per-element Adagrad); the history's last 50 behaviours in order,
padded after them, masked (padding index 0 is a zero row: FuxiCTR's DIN masks by `hist_item != 0`);
DIN's attention = FuxiCTR's `DIN_Attention` over [q, k, q - k, q * k] with hidden [80, 40] PReLU
(per-unit slopes) and one output, no softmax, the scores times the mask; DNN [200, 80] -> 1 ReLU
over [candidate (16), pooled history (16)] (FuxiCTR's feature order, a permutation of oar's
concat: the same function); no dropout, batch norm or regularization; Adagrad 0.05 (accumulator
0, eps 1e-10) on the tables, Adam 1e-3 on the rest; batches in file order, one pass.
"""
import argparse
import glob
import os
import sys
import time
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as ref  # noqa: E402  (import_zoo's path handling, optimizers, inits)

EMB = 8
ZOO = ref.ZOO
# The history length each job file keeps (its `sequence = L`).
SEQ = {"din": 50, "din_dice": 50, "din_base": 50, "dien": 50, "dien_aux": 50, "bst": 20, "bst_class": 20}


def read_dir(d):
    files = sorted(glob.glob(os.path.join(d, "part-*")))
    if not files:
        sys.exit(f"no part-* files in {d}")
    rows = []
    for f in files:
        with open(f) as fh:
            for line in fh:
                line = line.rstrip("\n")
                if not line:
                    continue
                h, c, t, tc, y = line.split(";")
                rows.append((h.split(), c.split(), t, tc, float(y)))
    return rows


def negatives(d):
    """Per line of DIR/part-* (sorted), the negative behaviours dien_aux.toml's `pipe_command`
    prints for it: [(item, category), ...], one per history position, categories as in the
    file (the command adds 1e9 to keep them apart from items in oar's one table)."""
    import subprocess
    import tomllib

    with open(os.path.join(HERE, "..", "dien_aux.toml"), "rb") as fh:
        command = tomllib.load(fh)["data"]["pipe_command"]
    out = []
    for f in sorted(glob.glob(os.path.join(d, "part-*"))):
        with open(f) as fh:
            text = subprocess.run(["sh", "-c", command], stdin=fh, capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            toks = [t.split(":", 1) for t in line.split()]
            items = [v for k, v in toks if k == "neg_item"]
            cates = [str(int(v) - 1000000000) for k, v in toks if k == "neg_cate"]
            out.append(list(zip(items, cates)))
    return out


def encode(train, test, SEQ, negs=None):
    """Index >= 1 for every item / category id of the training lines (history or candidate);
    0 is the padding row, held at zero, which unseen test ids also read (oar's evaluation reads
    an absent row as zeros)."""
    import numpy as np
    import torch

    items, cates = {}, {}
    for h, c, t, tc, _ in train:
        for i in h + [t]:
            items.setdefault(i, len(items) + 1)
        for i in c + [tc]:
            cates.setdefault(i, len(cates) + 1)

    def tensors(rows, negs=None):
        n = len(rows)
        hi = np.zeros((n, SEQ), np.int64)
        hc = np.zeros((n, SEQ), np.int64)
        ti = np.zeros(n, np.int64)
        tc_ = np.zeros(n, np.int64)
        y = np.zeros(n, np.float32)
        ni = np.zeros((n, SEQ), np.int64)  # negatives (dien_aux; zeros, all padding, elsewhere)
        nc = np.zeros((n, SEQ), np.int64)
        unseen = 0
        for r, (h, c, t, tc, lab) in enumerate(rows):
            if negs is not None:
                assert len(negs[r]) == len(h), (r, len(negs[r]), len(h))
            h, c = h[-SEQ:], c[-SEQ:]  # the most recent SEQ behaviours, in order, padded after
            for p, (a, b) in enumerate(zip(h, c)):
                hi[r, p] = items.get(a, 0)
                hc[r, p] = cates.get(b, 0)
                unseen += (a not in items) + (b not in cates)
            if negs is not None:
                for p, (a, b) in enumerate(negs[r][-SEQ:]):
                    ni[r, p] = items.get(a, 0)
                    nc[r, p] = cates.get(b, 0)
            ti[r] = items.get(t, 0)
            tc_[r] = cates.get(tc, 0)
            unseen += (t not in items) + (tc not in cates)
            y[r] = lab
        return {"item": torch.tensor(ti), "cate": torch.tensor(tc_), "hist_item": torch.tensor(hi),
                "hist_cate": torch.tensor(hc), "neg_item": torch.tensor(ni), "neg_cate": torch.tensor(nc),
                "y": torch.tensor(y), "unseen": unseen}

    if negs is not None:
        assert len(negs) == len(train), (len(negs), len(train))
    return {"items": len(items) + 1, "cates": len(cates) + 1, "train": tensors(train, negs), "test": tensors(test),
            "seq": SEQ}


def feature_map(data, pooled, neg=False):
    from fuxictr.features import FeatureMap

    fm = FeatureMap("din_oar_reference", "/tmp")
    enc = {"feature_encoder": "layers.MaskedAveragePooling()"} if pooled else {}
    fm.features = OrderedDict([
        ("item", {"source": "item", "type": "categorical", "padding_idx": 0, "vocab_size": data["items"]}),
        ("cate", {"source": "item", "type": "categorical", "padding_idx": 0, "vocab_size": data["cates"]}),
        ("hist_item", dict({"source": "user", "type": "sequence", "padding_idx": 0, "max_len": data["seq"],
                            "vocab_size": data["items"], "share_embedding": "item"}, **enc)),
        ("hist_cate", dict({"source": "user", "type": "sequence", "padding_idx": 0, "max_len": data["seq"],
                            "vocab_size": data["cates"], "share_embedding": "cate"}, **enc)),
    ])
    if neg:
        for name, table in (("neg_item", "item"), ("neg_cate", "cate")):
            fm.features[name] = {"source": "user", "type": "sequence", "padding_idx": 0, "max_len": data["seq"],
                                 "vocab_size": data["items" if table == "item" else "cates"], "share_embedding": table}
    fm.labels = ["label"]
    fm.default_emb_dim = EMB
    fm.num_fields = fm.get_num_fields()
    fm.set_column_index()
    return fm


def load(name, path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ZOO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(model, data):
    if not os.path.isdir(ZOO):
        sys.exit(f"FuxiCTR's model_zoo not found at {ZOO} (set FUXICTR_ZOO; see README.md)")
    kw = dict(ref.COMMON)
    if model in ("din", "din_dice"):
        # din_dice: the attention unit's hidden layers with FuxiCTR's Dice (oar's
        # `activation = "dice"`) instead of PReLU.
        DIN = load("fx_DIN", "DIN/src/DIN.py").DIN
        return DIN(feature_map(data, False), embedding_dim=EMB, dnn_hidden_units=[200, 80],
                   dnn_activations="ReLU", attention_hidden_units=[80, 40],
                   attention_hidden_activations="Dice" if model == "din_dice" else "PReLU", attention_output_activation=None,
                   attention_dropout=0, din_target_field=[("item", "cate")],
                   din_sequence_field=[("hist_item", "hist_cate")], din_use_softmax=False, **kw)
    if model == "dien_aux":
        # dien_aux.toml: dien's graph and FuxiCTR's auxiliary MLP; its loss is aux_loss below.
        DIEN = load("fx_DIEN", "DIEN/src/DIEN.py").DIEN
        return DIEN(feature_map(data, False, neg=True), embedding_dim=EMB, dnn_hidden_units=[200, 80],
                    dnn_activations="ReLU", dien_target_field=[("item", "cate")],
                    dien_sequence_field=[("hist_item", "hist_cate")], dien_neg_seq_field=[("neg_item", "neg_cate")],
                    gru_type="AUGRU", enable_sum_pooling=False, attention_type="din_attention",
                    attention_hidden_units=[80, 40], attention_activation="PReLU",
                    use_attention_softmax=True, aux_loss_alpha=1.0, aux_hidden_units=[100, 50],
                    aux_activation="ReLU", **kw)
    if model == "dien":
        # dien.toml: GRU (hidden 16 = the behaviour's width) over the history, DIN's unit over
        # [q, k, q - k, q * k] with PReLU and a softmax over the real positions, an AUGRU, MLP
        # [200, 80] over [last AUGRU state, candidate]; no auxiliary loss, no batch norm.
        DIEN = load("fx_DIEN", "DIEN/src/DIEN.py").DIEN
        return DIEN(feature_map(data, False), embedding_dim=EMB, dnn_hidden_units=[200, 80],
                    dnn_activations="ReLU", dien_target_field=[("item", "cate")],
                    dien_sequence_field=[("hist_item", "hist_cate")], dien_neg_seq_field=[],
                    gru_type="AUGRU", enable_sum_pooling=False, attention_type="din_attention",
                    attention_hidden_units=[80, 40], attention_activation="PReLU",
                    use_attention_softmax=True, aux_loss_alpha=0, **kw)
    if model == "bst":
        return bst_graph(feature_map(data, False), kw)
    if model == "bst_class":
        BST = load("fx_BST", "BST/src/BST.py").BST
        return BST(feature_map(data, False), embedding_dim=EMB, dnn_hidden_units=[200, 80],
                   dnn_activations="ReLU", num_heads=2, stacked_transformer_layers=1,
                   bst_target_field=[("item", "cate")], bst_sequence_field=[("hist_item", "hist_cate")],
                   seq_pooling_type="mean", use_position_emb=True, layer_norm=True, use_residual=True, **kw)
    DNN = load("fx_DNN", "DNN/DNN_torch/src/DNN.py").DNN
    return DNN(feature_map(data, True), embedding_dim=EMB, hidden_units=[200, 80], hidden_activations="ReLU", **kw)


def bst_graph(fm, kw):
    """examples/zoo/bst_din_format.toml from FuxiCTR's layers (`FeatureEmbeddingDict`,
    `ScaledDotProductAttention`, `MLP_Block`) and torch's (`Linear`, `LayerNorm`): the history
    [item | cate] (L x 16) and the candidate as one more position (L + 1 x 16), learned
    positions added; 2 heads of 8, Q/K/V and the residual projection without biases, keys of the
    padding masked, no scaling, no activation; LayerNorm; per-position Linear 16 -> 32 ReLU ->
    16, added to its input; LayerNorm; MLP [200, 80] -> 1 over the flattened (L + 1) x 16."""
    import torch
    from torch import nn
    from fuxictr.pytorch.models import BaseModel
    from fuxictr.pytorch.layers import FeatureEmbeddingDict, MLP_Block, ScaledDotProductAttention

    class BSTGraph(BaseModel):
        def __init__(self):
            super().__init__(fm, model_id="bst_graph", **kw)
            d, n = 2 * EMB, fm.features["hist_item"]["max_len"] + 1
            self.emb = FeatureEmbeddingDict(fm, EMB)
            self.positions = nn.Parameter(torch.empty(n, d).uniform_(-d ** -0.5, d ** -0.5))
            self.q, self.k, self.v, self.r = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.att = ScaledDotProductAttention()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
            self.dnn = MLP_Block(input_dim=n * d, output_dim=1, hidden_units=[200, 80],
                                 hidden_activations="ReLU", output_activation=self.output_activation)
            self.compile(kw["optimizer"], kw["loss"], 1e-3)
            self.reset_parameters()

        def forward(self, inputs):
            X = self.get_inputs(inputs)
            e = self.emb(X)
            hist = torch.cat([e["hist_item"], e["hist_cate"]], dim=-1)
            cand = torch.cat([e["item"], e["cate"]], dim=-1).unsqueeze(1)
            x = torch.cat([hist, cand], dim=1) + self.positions
            b, n, d = x.shape
            mask = torch.cat([X["hist_item"] != 0, torch.ones(b, 1, dtype=torch.bool)], dim=1)
            heads = lambda t: t.view(b, n, 2, d // 2).transpose(1, 2)  # noqa: E731
            mask = mask[:, None, None, :].expand(b, 2, n, n)
            o, _ = self.att(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), mask=mask)
            a = self.norm1(o.transpose(1, 2).reshape(b, n, d) + self.r(x))
            h = self.norm2(a + self.ffn(a))
            return {"y_pred": self.dnn(h.flatten(start_dim=1))}

    return BSTGraph()


def oar_init(model):
    """run.py's oar_init (embeddings U(+-0.05), Linear weights and biases U(+-1/sqrt(fan-in))) and
    PReLU slopes 0.25 (oar's target_attention; FuxiCTR starts them at 0.1)."""
    import torch
    from torch import nn

    ref.oar_init(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.PReLU):
                m.weight.fill_(0.25)


def embedding_params(model):
    from torch import nn
    return {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}


def apply_init(model, init, oar):
    """library / oar (see run.py), or a mix for finding which part matters: `oar-emb` = oar's
    embedding rows with FuxiCTR's dense init, `oar-dense` = FuxiCTR's embedding rows with oar's
    dense init. `oar` is the function applying oar's init to the whole model."""
    import torch

    if init == "oar":
        oar(model)
        return
    ref.library_init(model)
    if init == "library":
        return
    keep = {n: p.detach().clone() for n, p in model.named_parameters()}
    oar(model)
    emb = embedding_params(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if (id(p) in emb) == (init == "oar-dense"):  # restore FuxiCTR's values of the other part
                p.copy_(keep[n])


def aux_loss(model, out):
    """DIEN's auxiliary loss from FuxiCTR's terms (its aux_net on [state t, behaviour t + 1]),
    reduced as oar's `next_item_loss`: per sample the mean over its real pairs, then the batch's."""
    import torch
    import torch.nn.functional as F

    h, pos, neg = out["interest_emb"], out["pos_emb"], out["neg_emb"]
    mask = out["pad_mask"][:, 1:].float()
    width = h.shape[-1] + pos.shape[-1]
    score = lambda e: model.aux_net(torch.cat([h[:, :-1], e[:, 1:]], -1).reshape(-1, width)).view(mask.shape)
    sp, sn = score(pos), score(neg)
    per_pair = F.binary_cross_entropy(sp, torch.ones_like(sp), reduction="none") + \
        F.binary_cross_entropy(sn, torch.zeros_like(sn), reduction="none")
    return ((per_pair * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()


def run(model_name, init, data, seed, batch):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.metrics import roc_auc_score

    torch.manual_seed(seed)
    np.random.seed(seed)
    model = build(model_name, data)
    positions = getattr(model, "positions", None)  # bst: U(+-1/sqrt(16)) under every init
    start = positions.detach().clone() if positions is not None else None
    apply_init(model, init, oar_init)
    if start is not None:
        with torch.no_grad():
            positions.copy_(start)
    opts = ref.optimizers(model, 1e-3)
    keys = ["item", "cate", "hist_item", "hist_cate"] + (["neg_item", "neg_cate"] if model_name == "dien_aux" else [])
    tr = data["train"]
    n = len(tr["y"])
    model.train()
    for start in range(0, n, batch):  # file order, one pass, last batch partial
        sl = slice(start, start + batch)
        X = OrderedDict((k, tr[k][sl]) for k in keys)
        out = model(X)
        p = out["y_pred"].view(-1)
        loss = F.binary_cross_entropy(p, tr["y"][sl])
        if model_name == "dien_aux":
            loss = loss + aux_loss(model, out)
        ref.step(opts, loss)
    model.eval()
    te = data["test"]
    with torch.no_grad():
        p = model(OrderedDict((k, te[k]) for k in keys))["y_pred"].view(-1)
    return roc_auc_score(te["y"].numpy(), p.numpy())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--model", nargs="+", default=["din", "din_base"], choices=list(SEQ))
    ap.add_argument("--seed", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--init", default="library", choices=["library", "oar", "oar-emb", "oar-dense"])
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    t = time.time()
    rows = read_dir(os.path.join(a.dir, "train")), read_dir(os.path.join(a.dir, "test"))
    encoded = {}
    for m in a.model:
        key = (SEQ[m], m == "dien_aux")
        if key not in encoded:
            negs = negatives(os.path.join(a.dir, "train")) if m == "dien_aux" else None
            encoded[key] = data = encode(*rows, SEQ[m], negs)
            print(f"# {len(data['train']['y'])} train / {len(data['test']['y'])} test lines, {data['items'] - 1} items, "
                  f"{data['cates'] - 1} categories, {data['test']['unseen']} unseen test ids, history {SEQ[m]} "
                  f"({time.time() - t:.1f} s)", file=sys.stderr, flush=True)
        data = encoded[key]
        for seed in a.seed:
            t = time.time()
            auc = run(m, a.init, data, seed, a.batch_size)
            print(f"{m} init {a.init} seed {seed} test AUC {auc:.6f} ({time.time() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
