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

from .tables import dense_spec_of


class _Rows(torch.autograd.Function):
    """The pulled rows of a lookup as a tensor whose gradient goes to the step. The anchor, a
    parameter that requires grad, is what makes autograd call ``backward`` at all: the rows
    come from numpy, not from a tensor that requires grad."""

    @staticmethod
    def forward(ctx, anchor, rows, step, table, uniq, counts):
        ctx.oar = (step, table, uniq, counts)
        return torch.from_numpy(rows)

    @staticmethod
    def backward(ctx, grad):
        step, table, uniq, counts = ctx.oar
        step.add(table, uniq, grad.detach().contiguous().numpy(), counts)
        return None, None, None, None, None, None


def _unique(ids):
    """Unique u64 ids of a tensor of ids (int64 keys are read as their u64 bits) and the index
    of each one's unique id."""
    flat = ids.detach().reshape(-1).cpu().numpy()
    if flat.dtype == np.int64:
        flat = flat.view(np.uint64)
    uniq, inverse = np.unique(flat.astype(np.uint64, copy=False), return_inverse=True)
    return uniq, inverse.reshape(-1)


class _Lookup(torch.nn.Module):
    """What both layers share: the table, the anchor, the pull of a batch's unique ids."""

    def __init__(self, tables, table):
        super().__init__()
        if table not in tables.dims:
            raise ValueError(f"no table {table!r}: the tables are {sorted(tables.dims)}")
        self.tables, self.table, self.dim = tables, table, tables.dims[table]
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def rows(self, ids, samples):
        """The rows of the unique ids in ``ids`` (a tensor, ``[n_unique, dim]``) and the index
        of each occurrence's row; ``samples`` gives each occurrence's sample (for clicks)."""
        uniq, inverse = _unique(ids)
        step = self.tables.current_step
        if step is None or not torch.is_grad_enabled():
            rows, _ = self.tables.pull(self.table, uniq, create=False)
            return torch.from_numpy(rows), torch.from_numpy(inverse)
        rows = step.pull(self.table, uniq)
        counts = step.counts(inverse, samples)
        return _Rows.apply(self.anchor, rows, step, self.table, uniq, counts), torch.from_numpy(inverse)


class Embedding(_Lookup):
    """``torch.nn.Embedding`` on oar's table ``table``: ids ``[batch, ...]`` (the first axis is
    the sample) give rows ``[batch, ..., dim]``."""

    def forward(self, ids):
        samples = np.repeat(np.arange(ids.shape[0]), ids[0].numel() if ids.dim() > 1 else 1)
        rows, inverse = self.rows(ids, samples)
        return torch.nn.functional.embedding(inverse, rows).reshape(*ids.shape, self.dim)


class EmbeddingBag(_Lookup):
    """``torch.nn.EmbeddingBag`` on oar's table ``table``: ``mode`` ``"sum"``, ``"mean"`` or
    ``"max"``; ids ``[batch, bag]`` (bags of one length) or flat ids with ``offsets``."""

    def __init__(self, tables, table, mode="sum"):
        super().__init__(tables, table)
        self.mode = mode

    def forward(self, ids, offsets=None):
        if offsets is None:
            if ids.dim() != 2:
                raise ValueError("EmbeddingBag: ids [batch, bag], or flat ids with offsets")
            batch, bag = ids.shape
            samples = np.repeat(np.arange(batch), bag)
            offsets = torch.arange(0, batch * bag, bag, dtype=torch.long) if bag else torch.zeros(batch, dtype=torch.long)
        else:
            starts = offsets.cpu().numpy()
            lengths = np.diff(np.append(starts, ids.numel()))
            samples = np.repeat(np.arange(len(starts)), lengths)
        rows, inverse = self.rows(ids, samples)
        return torch.nn.functional.embedding_bag(inverse, rows, offsets.to(torch.long), mode=self.mode)


def dense_spec(module, prefix=""):
    """The ``dense`` entries of a :class:`oar.Tables` spec for ``module``'s parameters (in
    ``named_parameters`` order), each drawn by the servers from an initializer of its kind and
    scale (see :func:`oar.tables.dense_spec_of`)."""
    return dense_spec_of((prefix + n, p.detach().cpu().numpy()) for n, p in module.named_parameters())


class ServerDense:
    """``module``'s parameters kept on oar's servers: :meth:`pull` copies the servers' values
    into them, :meth:`push` hands their gradients to the step (the servers' dense optimizer
    applies them); the tables' spec must hold :func:`dense_spec` of the module."""

    def __init__(self, module, tables):
        self.tables = tables
        self.params = [p for _, p in module.named_parameters()]
        total = sum(p.numel() for p in self.params)
        if total != tables.dense_len:
            raise ValueError(f"the module has {total} parameters, the servers keep {tables.dense_len} dense floats")

    def pull(self):
        """The servers' values into the module (within a step: noting their version)."""
        step = self.tables.current_step
        flat, _ = (step.pull_dense(), None) if step is not None else self.tables.pull_dense()
        at = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(torch.from_numpy(flat[at:at + p.numel()]).reshape(p.shape))
                p.grad = None
                at += p.numel()

    def push(self):
        """The module's gradients into the step under way (pushed when it ends)."""
        step = self.tables.current_step
        if step is None:
            raise RuntimeError("ServerDense.push: within a step (with tables.step(labels): ...)")
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in self.params]
        step.set_dense(torch.cat(grads).detach().numpy())
