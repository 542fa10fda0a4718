"""PaddleRec's ``config.yaml`` read as an oar job, for the rank models oar's zoo has.

``oar.paddlerec.load("models/rank/dnn/config.yaml")`` gives a :class:`PaddleRecJob`: the
:class:`oar.Job` (the model ``hyper_parameters`` describe, its optimizer, PaddleRec's slot data
format), the run's flags from ``runner`` (data folders, passes, output, mode), and the keys it
did not use, each with the reason. ``.launch(servers=2, workers=2)`` and ``.train()`` run it.

The models: ``dnn`` (PaddleRec's ``models/rank/dnn``: the slots embedded, concatenated with the
dense values, an MLP), ``wide_deep`` and ``deepfm``, over the Criteo slot data PaddleRec's
readers read (``click:0 dense_feature:0.1 .. 1:737395 ..``), which oar reads as it is. A
model's name is the config's folder (``models/rank/deepfm``) unless ``model=`` says. The
mapping is oar's own (``oar train --paddlerec-config`` reads configs the same way).
"""

from pathlib import Path

from . import _oar
from .job import Job

class PaddleRecJob:
    """A PaddleRec config read for oar: ``job`` (a :class:`oar.Job`), ``flags`` (the run's
    flags: train, test, output, mode), ``unused`` (key -> why it was not used)."""

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


def load(path, model=None):
    """Reads PaddleRec's ``config.yaml`` at ``path`` as a :class:`PaddleRecJob` (as ``oar train
    --paddlerec-config`` reads it); raises :class:`oar.ConfigError` naming a key oar cannot
    honour."""
    read = _oar.paddlerec(Path(path), model)
    flags = {k: v for k, v in read["flags"].items() if v is not None}
    return PaddleRecJob(Job(read["job"]), flags, dict(read["unused"]))
