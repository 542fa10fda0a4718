"""oar from Python: a parameter-server system for recommendation models.

Jobs (``launch``, ``train``, ``export``, ``serve``) run as child processes of ``python -m oar``;
saved models are scored in this process into numpy arrays (``predict``, ``evaluate``); a job's
settings are a :class:`Job` (its graph built with :class:`Model`, or read from a job file),
checked by oar itself. Errors are :class:`OarError` and its
kinds, carrying oar's messages. A network of your own (PyTorch, Paddle) trains on oar's
tables through :class:`Tables` (``oar.torch``, ``oar.paddle``). The command line is here too: ``oar`` or ``python -m oar``.
"""

from . import data, errors, paddlerec
from ._oar import version as _version
from .curves import curves
from .errors import ConfigError, JobFailed, OarError
from .job import Job
from .jobs import Serving, Summary, export, launch, serve, train
from .model import Model, Tensor
from .saved import evaluate, predict

__version__ = _version()


def __getattr__(name):
    # The tables' classes come with numpy, which `import oar` itself does not need.
    if name in ("Servers", "Step", "Tables"):
        from . import tables

        return getattr(tables, name)
    raise AttributeError(f"module 'oar' has no attribute {name!r}")

__all__ = [
    "ConfigError",
    "Job",
    "JobFailed",
    "Model",
    "OarError",
    "Servers",
    "Serving",
    "Step",
    "Summary",
    "Tables",
    "Tensor",
    "curves",
    "data",
    "errors",
    "evaluate",
    "export",
    "launch",
    "paddlerec",
    "predict",
    "serve",
    "train",
]
