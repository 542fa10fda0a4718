"""oar's tables as PaddlePaddle layers (dynamic graphs): rows live on oar's servers, the
network in Paddle.

:class:`Embedding` takes the place of ``paddle.nn.Embedding(..., sparse=True)`` (and of
``paddle.static.nn.sparse_embedding`` in a dynamic-graph model): its rows are pulled from a
:class:`oar.Tables` table for the ids of the batch, and the gradients of those rows are pushed
back, summed per id with their shows and clicks, when the step ends. :class:`ServerDense`
keeps a layer's own parameters on the servers too (the servers run the dense optimizer)::

    emb = oar.paddle.Embedding(tables, "emb")       # was paddle.nn.Embedding(n, dim, sparse=True)
    with tables.step(labels) as step:
        dense.pull()
        loss = net(emb(ids), ...); loss.backward()
        dense.push()
"""

import numpy as np
import paddle

from .tables import Lookup, dense_spec_of
from .tables import ServerDense as _ServerDense


class _Rows(paddle.autograd.PyLayer):
    """A lookup's rows as a tensor whose gradient goes to the step. The anchor, a tensor that
    needs a gradient, is what makes Paddle call ``backward`` at all; Paddle wants a tensor back
    for it."""

    @staticmethod
    def forward(ctx, anchor, lookup):
        ctx.lookup = lookup
        return paddle.to_tensor(lookup.rows)

    @staticmethod
    def backward(ctx, grad):
        ctx.lookup.grad(grad.numpy())
        return paddle.zeros([1], dtype="float32")


class Embedding(paddle.nn.Layer):
    """``paddle.nn.Embedding`` on oar's table ``table``: ids ``[batch, ...]`` (int64; the first
    axis is the sample) give rows ``[batch, ..., dim]``; ``padding_idx`` as Paddle's."""

    def __init__(self, tables, table, padding_idx=None):
        super().__init__()
        self.tables, self.table, self.dim, self.padding_idx = tables, table, tables.dim(table), padding_idx
        # Not a parameter: no optimizer and no ServerDense should see it.
        self.anchor = paddle.zeros([1], dtype="float32")
        self.anchor.stop_gradient = False

    def forward(self, ids):
        training = self.tables.current_step is not None and paddle.is_grad_enabled()
        lookup = Lookup(self.tables, self.table, ids.numpy(), self.padding_idx, training)
        rows = _Rows.apply(self.anchor, lookup) if training else paddle.to_tensor(lookup.rows)
        out = paddle.nn.functional.embedding(paddle.to_tensor(lookup.inverse.astype(np.int64)), rows)
        return out.reshape([*ids.shape, self.dim])


def swap_embeddings(layer, tables, names):
    """Replaces ``layer``'s ``paddle.nn.Embedding`` sublayers named in ``names`` (attribute
    name, or dotted path, to oar table) by oar's :class:`Embedding` of that table, keeping each
    one's ``padding_idx``: a model such as PaddleRec's runs on oar's tables with no other
    change. Returns the layer."""
    for path, table in names.items():
        owner, _, attr = path.rpartition(".")
        parent = layer
        for part in filter(None, owner.split(".")):
            parent = getattr(parent, part)
        old = getattr(parent, attr, None)
        if not isinstance(old, paddle.nn.Embedding):
            raise ValueError(f"{path}: not a paddle.nn.Embedding of the layer ({type(old).__name__})")
        padding = getattr(old, "_padding_idx", None)
        setattr(parent, attr, Embedding(tables, table, padding_idx=None if padding is None or padding < 0 else padding))
    return layer


def dense_parameters(layer):
    """``layer``'s parameters but its ``paddle.nn.Embedding`` layers' (the tables that oar's
    layers take the place of), as ``(name, parameter)``."""
    skip = {id(p) for m in layer.sublayers(include_self=True) if isinstance(m, paddle.nn.Embedding) for p in m.parameters()}
    return [(n, p) for n, p in layer.named_parameters() if id(p) not in skip]


def dense_spec(layer, prefix=""):
    """The ``dense`` entries of a :class:`oar.Tables` spec for :func:`dense_parameters` of
    ``layer`` (see :func:`oar.tables.dense_spec_of`)."""
    return dense_spec_of((prefix + n, p.numpy()) for n, p in dense_parameters(layer))


class ServerDense(_ServerDense):
    """``layer``'s :func:`dense_parameters` kept on oar's servers (see
    :class:`oar.tables.ServerDense`); the tables' spec must hold :func:`dense_spec` of it."""

    def __init__(self, layer, tables):
        super().__init__((p for _, p in dense_parameters(layer)), tables, "layer")

    def size(self, p):
        return int(np.prod(p.shape))

    def assign(self, p, values):
        p.set_value(values.reshape(p.shape))
        p.clear_gradient()

    def gradient(self, p):
        return np.zeros(self.size(p), np.float32) if p.grad is None else p.grad.numpy().reshape(-1)
