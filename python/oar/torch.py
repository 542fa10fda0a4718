"""oar's tables as PyTorch layers: rows live on oar's servers, the network in PyTorch.

:class:`Embedding` and :class:`EmbeddingBag` take the place of ``torch.nn.Embedding`` and
``torch.nn.EmbeddingBag``; their rows are pulled from a :class:`oar.Tables` table for the ids
of the batch, and the gradients of those rows are pushed back, summed per id with their shows
and clicks, when the step ends. :class:`ServerDense` keeps a module's own parameters on the
servers too, so every trainer trains one network (the servers run the dense optimizer)::

    tables = oar.Tables(addresses, {"tables": [...], "dense": oar.torch.dense_spec(net)}, ...)
    emb = oar.torch.EmbeddingBag(tables, "emb", mode="sum")
    dense = oar.torch.ServerDense(net, tables)
    with tables.step(labels) as step:
        dense.pull()
        loss = bce(net(emb(ids)), labels)
        loss.backward()
        dense.push()

Outside a step (``torch.no_grad()`` evaluation) the layers read rows without creating them and
push nothing.
"""

import numpy as np
import torch

from .tables import Lookup, dense_spec_of
from .tables import ServerDense as _ServerDense


class _Rows(torch.autograd.Function):
    """A lookup's rows as a tensor whose gradient goes to the step. The anchor, a tensor that
    requires grad, is what makes autograd call ``backward`` at all: the rows come from numpy,
    not from a tensor that requires grad."""

    @staticmethod
    def forward(ctx, anchor, lookup):
        ctx.lookup = lookup
        return torch.from_numpy(lookup.rows)

    @staticmethod
    def backward(ctx, grad):
        ctx.lookup.grad(grad.detach().contiguous().numpy())
        return None, None


class _Table(torch.nn.Module):
    """What both layers share: the table, the anchor, a batch's rows."""

    def __init__(self, tables, table, padding_idx=None):
        super().__init__()
        self.tables, self.table, self.dim, self.padding_idx = tables, table, tables.dim(table), padding_idx
        # Not a parameter: no optimizer and no ServerDense should see it.
        self.anchor = torch.zeros(1, requires_grad=True)

    def rows(self, ids):
        """The rows of the unique ids of ``ids`` (first axis: the sample) and each id's row."""
        training = self.tables.current_step is not None and torch.is_grad_enabled()
        lookup = Lookup(self.tables, self.table, ids.detach().cpu().numpy(), self.padding_idx, training)
        rows = _Rows.apply(self.anchor, lookup) if training else torch.from_numpy(lookup.rows)
        return rows, torch.from_numpy(lookup.inverse)


class Embedding(_Table):
    """``torch.nn.Embedding`` on oar's table ``table``: ids ``[batch, ...]`` (the first axis is
    the sample) give rows ``[batch, ..., dim]``; ``padding_idx`` as torch's."""

    def forward(self, ids):
        rows, inverse = self.rows(ids)
        return torch.nn.functional.embedding(inverse, rows).reshape(*ids.shape, self.dim)


class EmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` on oar's table ``table``: ``mode`` ``"sum"``, ``"mean"`` or
    ``"max"``; ids ``[batch, bag]`` (bags of one length)."""

    def __init__(self, tables, table, mode="sum", padding_idx=None):
        super().__init__(tables, table, padding_idx)
        self.mode = mode

    def forward(self, ids):
        if ids.dim() != 2:
            raise ValueError(f"EmbeddingBag: ids [batch, bag], not {list(ids.shape)}")
        rows, inverse = self.rows(ids)
        return torch.nn.functional.embedding_bag(inverse.reshape(ids.shape), rows, mode=self.mode)


def dense_parameters(module):
    """``module``'s parameters but its ``torch.nn.Embedding`` and ``EmbeddingBag`` layers' (the
    tables that oar's layers take the place of), as ``(name, parameter)``."""
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    skip = {id(p) for m in module.modules() if isinstance(m, kinds) for p in m.parameters()}
    return [(n, p) for n, p in module.named_parameters() if id(p) not in skip]


def dense_spec(module, prefix=""):
    """The ``dense`` entries of a :class:`oar.Tables` spec for :func:`dense_parameters` of
    ``module``, each drawn by the servers from an initializer of its kind and scale (see
    :func:`oar.tables.dense_spec_of`)."""
    return dense_spec_of((prefix + n, p.detach().cpu().numpy()) for n, p in dense_parameters(module))


class ServerDense(_ServerDense):
    """``module``'s :func:`dense_parameters` kept on oar's servers (see
    :class:`oar.tables.ServerDense`); the tables' spec must hold :func:`dense_spec` of it."""

    def __init__(self, module, tables):
        super().__init__((p for _, p in dense_parameters(module)), tables, "module")

    def size(self, p):
        return p.numel()

    def assign(self, p, values):
        with torch.no_grad():
            p.copy_(torch.from_numpy(values).reshape(p.shape))
        p.grad = None

    def gradient(self, p):
        return np.zeros(p.numel(), np.float32) if p.grad is None else p.grad.detach().reshape(-1).numpy()
