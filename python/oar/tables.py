"""oar's tables under a network of your own: servers, and a trainer's connection to them.

The big sparse tables (and, if you like, the dense parameters) live on oar's servers, which
run the optimizers and the row lifecycle; the network runs in your framework. A step pulls the
rows of the batch's unique ids, runs forward and backward, and pushes the gradient sums of
those rows with their shows and clicks, once per step, from the version it pulled::

    with oar.Servers(2, trainers=1, mode="async") as servers:
        tables = oar.Tables(servers.addresses, spec, trainer=0,
                            secret_file=servers.credential(0))
        with tables.step(labels) as step:
            rows = step.pull("emb", ids)           # unique ids: [n, dim] float32
            ...                                    # forward, backward
            step.add("emb", ids, grads, counts)    # per unique id; pushed at the end
        tables.close()

``oar.torch`` and ``oar.paddle`` wrap this as an embedding layer of each framework.
"""

import os
import secrets
import tempfile
import time
from pathlib import Path

import numpy as np

from . import _oar
from .children import Listening, said_in
from .errors import JobFailed, OarError
from .jobs import _flags, run


class Servers:
    """``n`` oar servers (``oar pserver``) on this machine for ``trainers`` trainers of job
    ``job`` in ``mode`` (``"async"`` or ``"sync"``), with a new master secret: each trainer
    connects with its own credential (:meth:`credential`). With ``save_dir``, they save the
    model there once every trainer has closed. Every other keyword is a flag of ``oar
    pserver``. Best used as ``with oar.Servers(...) as servers:``; :meth:`wait` waits for them
    to finish, :meth:`stop` stops them."""

    def __init__(self, n=1, *, trainers=1, mode="async", job="oar", folder=None, wait=60, **flags):
        self._tmp = None if folder is not None else tempfile.TemporaryDirectory(prefix="oar-servers-")
        self.folder = Path(folder if folder is not None else self._tmp.name)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.job, self.trainers = job, trainers
        self.master = self.folder / "master.secret"
        descriptor = os.open(self.master, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(secrets.token_hex(32))
        self.children = []
        try:
            for i in range(n):
                args = ["pserver", "--host", "127.0.0.1", "--port", 0, "--index", i, "--num-servers", n]
                args += ["--trainers", trainers, "--mode", mode, "--job", job, "--secret-file", self.master]
                self.children.append(Listening(args + _flags(**flags), "OAR_READY", wait, f"server {i}"))
        except BaseException:
            self.stop()
            raise
        self.addresses = [c.address for c in self.children]

    def credential(self, trainer):
        """The path of trainer ``trainer``'s credential (made on first use): it proves that
        trainer and no other, in this job only."""
        path = self.folder / f"trainer-{trainer}.secret"
        if not path.exists():
            run(["secret", "--master", self.master, "--job", self.job, "--trainer", trainer, "--out", path], quiet=True)
        return path

    def wait(self, timeout=300):
        """Waits up to ``timeout`` seconds for every server to finish (they do once every trainer
        has closed); raises :class:`oar.JobFailed` naming a server that failed or is still
        running."""
        deadline = time.monotonic() + timeout
        for i, child in enumerate(self.children):
            code = child.wait(max(0.0, deadline - time.monotonic()))
            if code is None:
                raise JobFailed(f"server {i} ({child.address}) still running after {timeout} s", None, child.command)
            if code != 0:
                raise JobFailed(said_in(child.errors, f"exit status {code}"), code, child.command)

    def stop(self):
        """Stops every server still running."""
        for child in self.children:
            child.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


class Tables:
    """Trainer ``trainer``'s connection to a job's servers at ``servers`` (addresses), declaring
    ``spec``: a dict with ``tables`` (a job file's ``[model] tables``: ``{"name": "emb", "dim":
    16, "optimizer": {"kind": "adagrad", "lr": 0.05}}``, ...), ``dense`` (parameters the servers
    keep: ``{"name", "len", "init"}``), ``sparse_optimizer``, ``dense_optimizer``, ``seed``.
    Keywords: ``job``, ``secret_file`` (this trainer's credential), ``tls_ca``,
    ``connect_timeout`` and ``reply_timeout`` (seconds), ``scale_stale``."""

    def __init__(self, servers, spec, *, trainer, **options):
        self._connection = _oar.Tables(list(servers), spec, trainer=trainer, **options)
        self._pid = os.getpid()
        self.trainer = trainer
        self.dims = dict(self._connection.tables)
        self._step = None

    @property
    def _tables(self):
        # A forked process (a DataLoader worker) shares the sockets: its frames would interleave
        # with the parent's, so it gets an error instead.
        if os.getpid() != self._pid:
            raise OarError(f"this connection (trainer {self.trainer}) was made in process {self._pid}: "
                           "connect anew in a forked process (a DataLoader worker)")
        return self._connection

    def dim(self, table):
        """Floats per row of ``table``; a ValueError naming the tables if there is none."""
        if table not in self.dims:
            raise ValueError(f"no table {table!r}: the tables are {sorted(self.dims)}")
        return self.dims[table]

    @property
    def dense_len(self):
        """Floats of the dense parameters the servers keep."""
        return self._tables.dense_len

    @property
    def position(self):
        """``(step, pass)``: the last step pushed (0 before any) and the pass under way."""
        return self._tables.position

    def pull(self, table, ids, create=True):
        """Rows of unique ``ids`` of ``table`` (``[len(ids), dim]`` float32) and their version."""
        return self._tables.pull(table, np.ascontiguousarray(ids, dtype=np.uint64), create)

    def pull_dense(self):
        """The dense parameters the servers keep (one flat float32 array) and their version."""
        return self._tables.pull_dense()

    def push(self, grads, *, base_version, samples, dense=None):
        """Pushes one step (see :class:`Step` for the easy way): ``grads`` maps a table to
        ``(ids, grads, counts)``; returns ``(discarded, staleness)``."""
        return self._tables.push(grads, base_version=base_version, samples=samples, dense=dense)

    def step(self, labels=None, samples=None, reduction="mean"):
        """A :class:`Step` of ``samples`` samples (``len(labels)`` if not given); ``labels`` (0 or
        1 per sample) count the clicks of every id looked up; ``reduction``: how the loss
        combines the samples (``"mean"`` or ``"sum"``)."""
        if self._step is not None:
            raise OarError("a step is under way: end it before the next one")
        if samples is None:
            if labels is None:
                raise ValueError("step: give labels or samples")
            samples = len(labels)
        self._step = Step(self, labels, samples, reduction)
        return self._step

    @property
    def current_step(self):
        """The :class:`Step` under way, or None."""
        return self._step

    def end_pass(self):
        """Ends the pass under way (in sync mode the servers wait for every trainer's)."""
        return self._tables.end_pass()

    def barrier(self):
        """Waits until every trainer has called ``barrier`` as often (within the servers'
        ``--timeout``, whose error names the trainers missing)."""
        return self._tables.barrier()

    def stats(self):
        """Every server's counters: a list of dicts (``version``, ``applied_samples``, ...)."""
        return self._tables.stats()

    def close(self):
        """Tells the servers this trainer is done; closing again does nothing."""
        self._tables.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Step:
    """One training step: pulls note the lowest version they saw; gradients added per table are
    summed per unique id with their shows and clicks, and pushed once, with the dense gradient
    if any, when the step ends (the end of the ``with`` block, or :meth:`push`). A step left by
    an exception pushes nothing. oar's servers take gradient sums over the step's samples: with
    ``reduction="mean"`` (a loss averaged over the batch, PyTorch's and Paddle's default) the
    gradients are multiplied by ``samples`` before the push."""

    def __init__(self, tables, labels, samples, reduction="mean"):
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction: 'mean' or 'sum', not {reduction!r}")
        self.tables, self.samples, self.reduction = tables, int(samples), reduction
        self.labels = None if labels is None else np.asarray(labels, dtype=np.float32).reshape(-1)
        self.version = None
        self.dense = None
        self.result = None
        self._grads = {}

    def saw(self, version):
        """Notes a version a pull of this step returned (the push carries the lowest)."""
        self.version = version if self.version is None else min(self.version, version)

    def pull(self, table, ids, create=True):
        """Rows of unique ``ids`` of ``table``, as :meth:`Tables.pull`, noting their version."""
        rows, version = self.tables.pull(table, ids, create)
        self.saw(version)
        return rows

    def pull_dense(self):
        """The dense parameters, as :meth:`Tables.pull_dense`, noting their version."""
        dense, version = self.tables.pull_dense()
        self.saw(version)
        return dense

    def counts(self, inverse, samples):
        """Shows and clicks per unique id (``[n, 2]``) of a lookup: ``inverse`` maps each
        occurrence to its unique id, ``samples`` to its sample (whose label is its click)."""
        n = int(inverse.max()) + 1 if len(inverse) else 0
        counts = np.zeros((n, 2), dtype=np.float32)
        np.add.at(counts[:, 0], inverse, 1.0)
        if self.labels is not None:
            if len(samples) and int(samples.max()) >= len(self.labels):
                raise ValueError(f"a lookup of {int(samples.max()) + 1} samples in a step of {len(self.labels)} labels")
            np.add.at(counts[:, 1], inverse, self.labels[samples])
        return counts

    def add(self, table, ids, grads, counts):
        """Adds the gradients of the unique ``ids`` of ``table`` (``[len(ids), dim]``) and their
        shows and clicks (``[len(ids), 2]``); a table looked up twice is summed per id."""
        ids = np.asarray(ids, dtype=np.uint64).reshape(-1)
        grads = np.asarray(grads, dtype=np.float32).reshape(len(ids), -1)
        counts = np.asarray(counts, dtype=np.float32).reshape(len(ids), 2)
        self._grads.setdefault(table, []).append((ids, grads, counts))

    def set_dense(self, grad):
        """The dense gradient of this step (``dense_len`` floats)."""
        self.dense = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)

    def _sums(self, factor):
        """Per table, the unique ids, their gradient sums (times ``factor``) and counts."""
        out = {}
        for table, parts in self._grads.items():
            if len(parts) == 1:
                ids, grads, counts = parts[0]
                out[table] = (ids, np.ascontiguousarray(grads * factor), np.ascontiguousarray(counts))
                continue
            ids = np.concatenate([p[0] for p in parts])
            uniq, inverse = np.unique(ids, return_inverse=True)
            sums = np.zeros((len(uniq), parts[0][1].shape[1]), dtype=np.float32)
            np.add.at(sums, inverse, np.concatenate([p[1] for p in parts]) * factor)
            counts = np.zeros((len(uniq), 2), dtype=np.float32)
            np.add.at(counts, inverse, np.concatenate([p[2] for p in parts]))
            out[table] = (uniq, sums, counts)
        return out

    def push(self):
        """Pushes the step's gradients (once); returns ``(discarded, staleness)``."""
        if self.result is None:
            if self.version is None:
                raise OarError("a step pushes the gradients of what it pulled: it pulled nothing")
            factor = np.float32(self.samples if self.reduction == "mean" else 1)
            dense = None if self.dense is None else self.dense * factor
            self.result = self.tables.push(self._sums(factor), base_version=self.version, samples=self.samples, dense=dense)
        return self.result

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.tables._step = None
        if kind is None:
            self.push()


def dense_spec_of(named_arrays):
    """The ``dense`` entries of a spec for parameters ``(name, array)``: each drawn by the
    servers (seeded, so every trainer starts from the same values) from an initializer of its
    kind and scale: zeros or a constant where every value is the same, else uniform with the
    array's standard deviation (PyTorch's and Paddle's default initializers are uniform)."""
    out = []
    for name, array in named_arrays:
        a = np.asarray(array, dtype=np.float64).reshape(-1)
        if a.size and np.all(a == a[0]):
            init = {"kind": "zeros"} if a[0] == 0 else {"kind": "constant", "value": float(a[0])}
        else:
            init = {"kind": "uniform", "scale": float(np.sqrt(3.0) * a.std()) if a.size else 0.0}
        out.append({"name": name, "len": int(a.size), "init": init})
    return out


class Lookup:
    """A batch's lookup in one table, as the framework layers make it: ``ids`` (a numpy array,
    the first axis the sample; int64 read as their u64 bits) pulled as unique ids (``rows``,
    ``[n_unique, dim]``, and ``inverse``, each id's row). With ``padding``, that id's row is
    zeros and is neither pulled nor pushed (``paddle.nn.Embedding``'s ``padding_idx``). Within
    a step, rows are created and :meth:`grad` hands the rows' gradient to the step; outside,
    absent rows read as zeros."""

    def __init__(self, tables, table, ids, padding=None, training=True):
        ids = np.asarray(ids)
        flat = ids.reshape(-1)
        if flat.dtype == np.int64:
            flat = flat.view(np.uint64)
        uniq, inverse = np.unique(flat.astype(np.uint64, copy=False), return_inverse=True)
        self.inverse = inverse.reshape(-1)
        self.keep = np.ones(len(uniq), dtype=bool) if padding is None else uniq != np.uint64(padding)
        self.uniq, self.table = uniq[self.keep], table
        self.step = tables.current_step if training else None
        self.rows = np.zeros((len(uniq), tables.dims[table]), dtype=np.float32)
        if self.step is not None:
            self.rows[self.keep] = self.step.pull(table, self.uniq)
            per_sample = flat.size // ids.shape[0] if ids.ndim and ids.shape[0] else 1
            samples = np.repeat(np.arange(ids.shape[0] if ids.ndim else 1), per_sample)
            self.counts = self.step.counts(self.inverse, samples)[self.keep]
        elif len(self.uniq):
            self.rows[self.keep] = tables.pull(table, self.uniq, create=False)[0]

    def grad(self, grad):
        """Hands the gradient of ``rows`` (``[n_unique, dim]``) to the step."""
        self.step.add(self.table, self.uniq, np.asarray(grad)[self.keep], self.counts)


class ServerDense:
    """A network's dense parameters kept on oar's servers: :meth:`pull` copies the servers'
    values into them, :meth:`push` hands their gradients to the step under way (the servers'
    dense optimizer applies them). ``oar.torch`` and ``oar.paddle`` say how a parameter of their
    framework is sized, written and read (``size``, ``assign``, ``gradient``)."""

    def __init__(self, params, tables, what):
        self.tables, self.params = tables, list(params)
        total = sum(self.size(p) for p in self.params)
        if total != tables.dense_len:
            raise ValueError(f"the {what} has {total} parameters, the servers keep {tables.dense_len} dense floats")

    def pull(self):
        """The servers' values into the parameters (within a step: noting their version)."""
        step = self.tables.current_step
        flat = step.pull_dense() if step is not None else self.tables.pull_dense()[0]
        at = 0
        for p in self.params:
            n = self.size(p)
            self.assign(p, flat[at:at + n])
            at += n

    def push(self):
        """The parameters' gradients into the step under way (pushed when it ends)."""
        step = self.tables.current_step
        if step is None:
            raise RuntimeError("ServerDense.push: within a step (with tables.step(labels): ...)")
        grads = [self.gradient(p) for p in self.params]
        step.set_dense(np.concatenate(grads) if grads else np.zeros(0, dtype=np.float32))
