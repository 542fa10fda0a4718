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

from .tables import dense_spec_of


class _Rows(paddle.autograd.PyLayer):
    """The pulled rows of a lookup as a tensor whose gradient goes to the step. The anchor, a
    parameter that needs a gradient, is what makes Paddle call ``backward`` at all; Paddle wants
    a tensor back for it."""

    @staticmethod
    def forward(ctx, anchor, rows, step, table, uniq, counts):
        ctx.oar = (step, table, uniq, counts)
        return paddle.to_tensor(rows)

    @staticmethod
    def backward(ctx, grad):
        step, table, uniq, counts = ctx.oar
        step.add(table, uniq, grad.numpy(), counts)
        return paddle.zeros([1], dtype="float32")


class Embedding(paddle.nn.Layer):
    """``paddle.nn.Embedding`` on oar's table ``table``: ids ``[batch, ...]`` (int64; the first
    axis is the sample) give rows ``[batch, ..., dim]``."""

    def __init__(self, tables, table):
        super().__init__()
        if table not in tables.dims:
            raise ValueError(f"no table {table!r}: the tables are {sorted(tables.dims)}")
        self.tables, self.table, self.dim = tables, table, tables.dims[table]
        self.anchor = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(0.0))

    def forward(self, ids):
        flat = ids.numpy().reshape(-1)
        if flat.dtype == np.int64:
            flat = flat.view(np.uint64)
        uniq, inverse = np.unique(flat.astype(np.uint64, copy=False), return_inverse=True)
        inverse = inverse.reshape(-1)
        step = self.tables.current_step
        if step is None or not paddle.is_grad_enabled():
            rows = paddle.to_tensor(self.tables.pull(self.table, uniq, create=False)[0])
        else:
            per_sample = flat.size // ids.shape[0] if ids.shape[0] else 0
            samples = np.repeat(np.arange(ids.shape[0]), per_sample)
            counts = step.counts(inverse, samples)
            rows = _Rows.apply(self.anchor, step.pull(self.table, uniq), step, self.table, uniq, counts)
        out = paddle.nn.functional.embedding(paddle.to_tensor(inverse.astype(np.int64)), rows)
        return out.reshape([*ids.shape, self.dim])


def dense_spec(layer, prefix=""):
    """The ``dense`` entries of a :class:`oar.Tables` spec for ``layer``'s parameters (in
    ``named_parameters`` order; see :func:`oar.tables.dense_spec_of`)."""
    return dense_spec_of((prefix + n, p.numpy()) for n, p in layer.named_parameters())


class ServerDense:
    """``layer``'s parameters kept on oar's servers: :meth:`pull` copies the servers' values
    into them, :meth:`push` hands their gradients to the step (the servers' dense optimizer
    applies them); the tables' spec must hold :func:`dense_spec` of the layer."""

    def __init__(self, layer, tables):
        self.tables = tables
        self.params = [p for _, p in layer.named_parameters()]
        total = sum(int(np.prod(p.shape)) for p in self.params)
        if total != tables.dense_len:
            raise ValueError(f"the layer has {total} parameters, the servers keep {tables.dense_len} dense floats")

    def pull(self):
        """The servers' values into the layer (within a step: noting their version)."""
        step = self.tables.current_step
        flat = step.pull_dense() if step is not None else self.tables.pull_dense()[0]
        at = 0
        for p in self.params:
            n = int(np.prod(p.shape))
            p.set_value(flat[at:at + n].reshape(p.shape))
            p.clear_gradient()
            at += n

    def push(self):
        """The layer's gradients into the step under way (pushed when it ends)."""
        step = self.tables.current_step
        if step is None:
            raise RuntimeError("ServerDense.push: within a step (with tables.step(labels): ...)")
        grads = []
        for p in self.params:
            g = p.grad
            grads.append(np.zeros(int(np.prod(p.shape)), np.float32) if g is None else g.numpy().reshape(-1))
        step.set_dense(np.concatenate(grads))
