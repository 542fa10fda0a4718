"""A job's ``[model]`` layer graph, built in Python.

The builder writes the same entries a job file's ``[model]`` holds (``tables``, ``layers``,
``output``/``loss`` or ``heads``), so the layers, their settings and every check and error
message are oar's own: ``Model.check()`` (or checking a :class:`oar.Job` holding it) runs the
checks of ``oar train --config``. A layer is added by calling its type on the model::

    m = oar.Model(output="logit", loss="log_loss")
    v = m.table("v", dim=10)
    emb = m.embedding("emb", table=v, slots="C1..C26")
    x = m.concat("x", [emb, m.dense])
    m.mlp("logit", x, hidden=[400, 400], out=1)

Each call returns the layer's output tensor (its name), to be given to later layers: one tensor
is the layer's ``input``, a list its ``inputs``. Every other keyword is the type's own setting,
as the job file names it (see the book's Models chapter).
"""

from . import _oar


class Tensor(str):
    """A tensor of the graph, named as its layer (``dense``: the sample's dense values)."""


class Model:
    """A ``[model]`` layer graph; its types are oar's layer types (``Model.types()``)."""

    #: The dense values of every sample (``[data]``'s dense columns).
    dense = Tensor("dense")

    def __init__(self, *, output=None, loss=None, **settings):
        self._config = dict(settings)
        if output is not None:
            self._config["output"] = str(output)
        if loss is not None:
            self._config["loss"] = loss
        self._tables = []
        self._layers = []
        self._heads = []

    @staticmethod
    def types():
        """Every layer type a graph may use: ``embedding`` and the registry's."""
        return ["embedding", *_oar.layer_types()]

    def table(self, name, dim, **settings):
        """An embedding table of ``dim`` floats per row (``init``, ``entry``, ``capacity``,
        ``accessor``, ...: a job file's table settings); returns its name for ``embedding``."""
        self._tables.append({"name": name, "dim": dim, **settings})
        return name

    def layer(self, type, name, inputs=None, **settings):
        """A layer of ``type`` named ``name`` over ``inputs`` (a tensor, or a list of them)."""
        entry = {"name": str(name), "type": type}
        if isinstance(inputs, (list, tuple)):
            entry["inputs"] = [str(i) for i in inputs]
        elif inputs is not None:
            entry["input"] = str(inputs)
        entry.update(settings)
        self._layers.append(entry)
        return Tensor(name)

    def head(self, output, loss, *, label=None, weight=None):
        """One loss head of a multi-task model: ``output`` trained with ``loss`` against the label
        column ``label`` (default: the head's position), its loss weighted by ``weight``."""
        head = {"output": str(output), "loss": loss}
        if label is not None:
            head["label"] = label
        if weight is not None:
            head["weight"] = weight
        self._heads.append(head)

    def __getattr__(self, type):
        if type.startswith("_"):
            raise AttributeError(type)
        if type not in self.types():
            raise AttributeError(f"no layer type {type!r}: oar has {', '.join(self.types())}")
        return lambda name, inputs=None, **settings: self.layer(type, name, inputs, **settings)

    def config(self):
        """The ``[model]`` section, as a dict."""
        config = dict(self._config)
        if self._tables:
            config["tables"] = [dict(t) for t in self._tables]
        if self._layers:
            config["layers"] = [dict(l) for l in self._layers]
        if self._heads:
            config["heads"] = [dict(h) for h in self._heads]
        return config

    def check(self, **job):
        """Checks the graph as ``oar train`` would, in a job with the other sections ``job``
        gives (``data={...}``, ...); raises :class:`oar.ConfigError` naming the layer or
        setting. Returns the model."""
        from .job import Job

        Job({**job, "model": self.config()}).check()
        return self
