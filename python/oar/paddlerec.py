"""PaddleRec's ``config.yaml`` read as an oar job, for the rank models oar's zoo has.

``oar.paddlerec.load("models/rank/dnn/config.yaml")`` gives a :class:`PaddleRecJob`: the
:class:`oar.Job` (the model ``hyper_parameters`` describe, its optimizer, PaddleRec's slot data
format), the run's flags from ``runner`` (data folders, passes, output, mode), and the keys it
did not use, each with the reason. ``.launch(servers=2, workers=2)`` and ``.train()`` run it.

The models: ``dnn`` (PaddleRec's ``models/rank/dnn``: the slots embedded, concatenated with the
dense values, an MLP), ``wide_deep`` and ``deepfm``, over the Criteo slot data PaddleRec's
readers read (``click:0 dense_feature:0.1 .. 1:737395 ..``), which oar reads as it is. A
model's name is the config's folder (``models/rank/deepfm``) unless ``model=`` says. Needs
PyYAML (``pip install pyyaml``).
"""

from pathlib import Path

from .errors import ConfigError
from .job import Job
from .model import Model

#: The models read, by PaddleRec's folder name.
MODELS = ("dnn", "wide_deep", "deepfm")

#: ``runner`` keys and the flag or setting each becomes.
RUNNER = {
    "train_data_dir": "--train",
    "test_data_dir": "--test",
    "train_batch_size": "[train] batch_size",
    "epochs": "--passes",
    "print_interval": "[train] log_every",
    "model_save_path": "--output",
    "thread_num": "[train] threads",
    "sync_mode": "--mode",
}

#: ``runner`` keys with no part in an oar job, and why.
IGNORED = {
    "train_reader_path": "oar reads PaddleRec's slot lines itself",
    "infer_reader_path": "oar reads PaddleRec's slot lines itself",
    "use_gpu": "oar trains on CPUs",
    "use_auc": "oar always reports AUC",
    "infer_batch_size": "inference is oar predict/serve",
    "infer_load_path": "inference is oar predict/serve",
    "infer_start_epoch": "inference is oar predict/serve",
    "infer_end_epoch": "inference is oar predict/serve",
    "use_inference": "oar export writes ONNX",
    "save_inference_feed_varnames": "oar export writes ONNX",
    "save_inference_fetch_varnames": "oar export writes ONNX",
    "num_workers": "oar's readers are threads of their own",
    "split_file_list": "oar shares files among trainers itself",
    "use_fleet": "oar is the parameter server",
    "reader_type": "oar reads PaddleRec's slot lines itself",
}

#: PaddleRec optimizer classes and oar's optimizer kinds.
OPTIMIZERS = {"adam": "adam", "adagrad": "adagrad", "sgd": "sgd"}


class PaddleRecJob:
    """A PaddleRec config read for oar: ``job`` (a :class:`oar.Job`), ``flags`` (the run's
    flags: train, test, output, passes, mode), ``unused`` (key -> why it was not used)."""

    def __init__(self, job, flags, unused):
        self.job, self.flags, self.unused = job, flags, unused

    def launch(self, **flags):
        """Runs it as ``oar launch`` (``servers``, ``workers`` and any other flag may be given)."""
        from .jobs import launch

        return launch(self.job, **{**self.flags, **flags})

    def train(self, **flags):
        """Trains it locally in one process, as ``oar train``."""
        from .jobs import train

        run = {k: v for k, v in {**self.flags, **flags}.items() if k != "mode"}
        return train(self.job, **run)


def _graph(name, hp):
    """The model ``name`` with ``hyper_parameters`` ``hp``."""
    dim = int(hp.get("sparse_feature_dim", 9))
    hidden = [int(h) for h in hp.get("fc_sizes", [512, 256, 128, 32])]
    slots = f"1..{int(hp.get('sparse_inputs_slots', 27)) - 1}"
    m = Model(output="logit", loss="log_loss")
    emb = m.embedding("slots", table=m.table("emb", dim=dim), slots=slots)
    x = m.concat("x", [emb, m.dense])
    if name == "dnn":
        m.mlp("logit", x, hidden=hidden, out=1)
        return m
    wide = m.embedding("wide", table=m.table("w", dim=1), slots=slots)
    parts = [m.reduce_sum("lr_s", wide, over="all"), m.linear("lr_d", m.dense, out=1), m.mlp("deep", x, hidden=hidden, out=1)]
    if name == "deepfm":
        parts.append(m.fm("fm", emb))
    m.add("logit", parts)
    return m


def _optimizer(hp, unused):
    spec = hp.get("optimizer", {}) or {}
    kind = OPTIMIZERS.get(str(spec.get("class", "adam")).lower())
    if kind is None:
        raise ConfigError(f"hyper_parameters.optimizer.class {spec.get('class')!r}: oar reads {', '.join(OPTIMIZERS)}")
    if "strategy" in spec:
        unused["hyper_parameters.optimizer.strategy"] = "runner.sync_mode gives the mode"
    return {"kind": kind, "lr": float(spec.get("learning_rate", 1e-3))}


def load(path, model=None):
    """Reads PaddleRec's ``config.yaml`` at ``path`` as a :class:`PaddleRecJob`; raises
    :class:`oar.ConfigError` naming a key oar cannot honour."""
    import yaml

    path = Path(path)
    config = yaml.safe_load(path.read_text()) or {}
    name = model or path.resolve().parent.name
    if name not in MODELS:
        raise ConfigError(f"{path}: model {name!r}; oar reads PaddleRec's {', '.join(MODELS)} (model=...)")
    runner, hp = config.get("runner", {}) or {}, config.get("hyper_parameters", {}) or {}
    unused = {}
    train = {}
    flags = {}
    for key, value in runner.items():
        target = RUNNER.get(key)
        if target is None:
            unused[f"runner.{key}"] = IGNORED.get(key, "not read by oar")
        elif key in ("train_data_dir", "test_data_dir", "model_save_path"):
            flags[target[2:]] = str((path.parent / value).resolve())
        elif key == "sync_mode":
            if value not in ("async", "sync"):
                raise ConfigError(f"{path}: runner.sync_mode {value!r}: oar runs async and sync")
            flags["mode"] = value
        elif key == "epochs":
            flags["passes"] = int(value)
        else:
            train[target.split("] ")[1]] = int(value)
    for key in hp:
        if key not in ("optimizer", "sparse_feature_dim", "fc_sizes", "sparse_inputs_slots", "dense_input_dim"):
            unused[f"hyper_parameters.{key}"] = "not part of oar's model" if key != "sparse_feature_number" else "oar's tables grow with the ids seen"
    for key in config:
        if key not in ("runner", "hyper_parameters"):
            unused[key] = "not read by oar yet"
    optimizer = _optimizer(hp, unused)
    data = {
        "format": "slots",
        "labels": ["click"],
        "dense": [{"name": "dense_feature", "width": int(hp.get("dense_input_dim", 13))}],
        "slots": [f"1..{int(hp.get('sparse_inputs_slots', 27)) - 1}"],
    }
    job = Job(model=_graph(name, hp), dense_optimizer=optimizer, sparse_optimizer=dict(optimizer), train=train, data=data)
    job.check()
    return PaddleRecJob(job, flags, unused)
