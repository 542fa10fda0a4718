"""A network of the user's own on oar's tables, in PyTorch and in Paddle, against real servers:
the adapters train exactly as the framework's own embedding layers with its own SGD (same
rows, same dense weights after 20 steps), in sync mode with one trainer; and a DeepFM in each
framework, 2 servers x 2 trainer processes async on generated Criteo-format data, learns, and
the servers count every sample it trained once, applied or discarded as too stale. Each
framework's tests skip without it (CI runs them: Paddle from PyPI, PyTorch from Debian's
python3-torch)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[2]
N, DIM, STEPS, LR = 30, 4, 20, 0.1


def has(module):
    return importlib.util.find_spec(module) is not None


def batches():
    rng = np.random.default_rng(3)
    out = []
    for _ in range(STEPS):
        a = rng.integers(0, N, (16, 3)).astype(np.int64)
        b = rng.integers(0, N, (16, 2)).astype(np.int64)  # id 0: the padding
        out.append((a, b, rng.integers(0, 2, 16).astype(np.float32)))
    return out


def spec(dense):
    init = {"kind": "constant", "value": 0.1}
    sgd = {"kind": "sgd", "lr": LR}
    tables = [{"name": "a", "dim": DIM, "init": init}, {"name": "b", "dim": DIM, "init": init}]
    return {"tables": tables, "dense": dense, "sparse_optimizer": sgd, "dense_optimizer": sgd}


def rows_of(tables, name):
    return tables.pull(name, np.arange(N, dtype=np.uint64), create=False)[0]


@pytest.mark.skipif(not has("torch"), reason="PyTorch is not installed")
def test_torch_layers_train_as_torchs_own():
    import torch

    import oar.torch

    def head():
        h = torch.nn.Linear(DIM, 1)
        torch.nn.init.constant_(h.weight, 0.05)
        torch.nn.init.zeros_(h.bias)
        return h

    # Torch's own: two tables and a head, all stepped by torch's SGD.
    bag, emb, own_head = torch.nn.EmbeddingBag(N, DIM, mode="sum"), torch.nn.Embedding(N, DIM, padding_idx=0), head()
    with torch.no_grad():
        bag.weight.fill_(0.1)
        emb.weight.fill_(0.1)
        emb.weight[0] = 0
    params = [*bag.parameters(), *emb.parameters(), *own_head.parameters()]
    sgd = torch.optim.SGD(params, lr=LR)
    loss_of = torch.nn.BCEWithLogitsLoss()
    for a, b, y in batches():
        sgd.zero_grad()
        x = bag(torch.from_numpy(a)) + emb(torch.from_numpy(b)).sum(1)
        loss_of(own_head(x).squeeze(1), torch.from_numpy(y)).backward()
        sgd.step()

    # The same on oar's tables, the head on the servers too.
    net = head()
    with oar.Servers(2, trainers=1, mode="sync", job="torch") as servers:
        tables = oar.Tables(servers.addresses, spec(oar.torch.dense_spec(net)), trainer=0, job="torch",
                            secret_file=servers.credential(0))
        obag, oemb = oar.torch.EmbeddingBag(tables, "a", mode="sum"), oar.torch.Embedding(tables, "b", padding_idx=0)
        dense = oar.torch.ServerDense(net, tables)
        assert not list(obag.parameters()), "the anchor is no parameter"
        for a, b, y in batches():
            with tables.step(y):
                dense.pull()
                x = obag(torch.from_numpy(a)) + oemb(torch.from_numpy(b)).sum(1)
                loss_of(net(x).squeeze(1), torch.from_numpy(y)).backward()
                dense.push()
        np.testing.assert_allclose(rows_of(tables, "a"), bag.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rows_of(tables, "b")[1:], emb.weight.detach().numpy()[1:], rtol=1e-5, atol=1e-6)
        assert not rows_of(tables, "b")[0].any(), "the padding id is never pulled nor pushed"
        dense.pull()
        np.testing.assert_allclose(net.weight.detach().numpy(), own_head.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
        # Evaluation outside a step reads rows, creates none and pushes nothing.
        with torch.no_grad():
            oemb(torch.tensor([[12345, 1]]))
        assert tables.position[0] == STEPS
        assert sum(sum(s["rows"]) for s in tables.stats()) == 2 * N - 1
        tables.close()
        servers.wait(60)


@pytest.mark.skipif(not has("paddle"), reason="PaddlePaddle is not installed")
def test_paddle_layers_train_as_paddles_own():
    import paddle

    import oar.paddle

    constant = paddle.nn.initializer.Constant

    def head():
        return paddle.nn.Linear(DIM, 1, weight_attr=paddle.ParamAttr(initializer=constant(0.05)),
                                bias_attr=paddle.ParamAttr(initializer=constant(0.0)))

    ea = paddle.nn.Embedding(N, DIM, weight_attr=paddle.ParamAttr(initializer=constant(0.1)))
    eb = paddle.nn.Embedding(N, DIM, padding_idx=0, weight_attr=paddle.ParamAttr(initializer=constant(0.1)))
    own_head = head()
    sgd = paddle.optimizer.SGD(LR, parameters=[*ea.parameters(), *eb.parameters(), *own_head.parameters()])
    loss_of = paddle.nn.BCEWithLogitsLoss()
    for a, b, y in batches():
        x = ea(paddle.to_tensor(a)).sum(1) + eb(paddle.to_tensor(b)).sum(1)
        loss_of(own_head(x).squeeze(1), paddle.to_tensor(y)).backward()
        sgd.step()
        sgd.clear_grad()

    class Net(paddle.nn.Layer):
        """A model as PaddleRec writes them: paddle.nn.Embedding layers, swapped for oar's."""

        def __init__(self):
            super().__init__()
            self.a = paddle.nn.Embedding(N, DIM, sparse=True)
            self.b = paddle.nn.Embedding(N, DIM, sparse=True, padding_idx=0)
            self.head = head()

        def forward(self, a, b):
            return self.head(self.a(a).sum(1) + self.b(b).sum(1)).squeeze(1)

    net = Net()
    with oar.Servers(2, trainers=1, mode="sync", job="paddle") as servers:
        tables = oar.Tables(servers.addresses, spec(oar.paddle.dense_spec(net)), trainer=0, job="paddle",
                            secret_file=servers.credential(0))
        oar.paddle.swap_embeddings(net, tables, {"a": "a", "b": "b"})
        assert net.b.padding_idx == 0
        with pytest.raises(ValueError, match="head: not a paddle.nn.Embedding"):
            oar.paddle.swap_embeddings(net, tables, {"head": "a"})
        dense = oar.paddle.ServerDense(net, tables)
        for a, b, y in batches():
            with tables.step(y):
                dense.pull()
                loss_of(net(paddle.to_tensor(a), paddle.to_tensor(b)), paddle.to_tensor(y)).backward()
                dense.push()
        np.testing.assert_allclose(rows_of(tables, "a"), ea.weight.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rows_of(tables, "b")[1:], eb.weight.numpy()[1:], rtol=1e-5, atol=1e-6)
        dense.pull()
        np.testing.assert_allclose(net.head.weight.numpy(), own_head.weight.numpy(), rtol=1e-5, atol=1e-6)
        tables.close()
        servers.wait(60)


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo")
    args = ["gen", "criteo", "--lines", 24000, "--test-lines", 4000, "--parts", 2, "--out", root]
    subprocess.run([sys.executable, "-m", "oar", *map(str, args)], check=True, capture_output=True)
    return root


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_deepfm_2x2_async_learns_and_the_servers_count_every_sample_once(framework, criteo, tmp_path):
    if not has(framework) or not has("pandas"):
        pytest.skip(f"{framework} or pandas is not installed")
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "examples/python/deepfm.py"), "--train", criteo / "train",
               "--test", criteo / "test", "--framework", framework, "--hidden", "64,32", "--out", out]
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["trained_samples"] == 24000
    # Counted where applied: each server applied every sample of each trainer's pushes once, or
    # discarded its push as too stale (async's lag ratio; a loaded machine makes some).
    applied, discarded = result["applied_samples"], result["discarded_samples"]
    assert [sum(a) + sum(d) for a, d in zip(applied, discarded)] == [24000, 24000], result
    assert min(sum(a) for a in applied) >= 24000 * 0.9, result
    assert result["auc"] > 0.65, result
