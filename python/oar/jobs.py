"""Jobs as child processes of ``python -m oar``: launch, train, export and serve.

A job runs in processes of its own, so a crash or an out-of-memory kill ends the job, not the
interpreter (or the notebook kernel). Its console output is passed through line by line; a
failure raises :class:`oar.JobFailed` with oar's message, and Ctrl-C (``KeyboardInterrupt``)
stops the job's processes before it is raised again.
"""

import json
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .children import Listening, said_in
from .errors import JobFailed
from .job import Job
from .progress import Progress

#: Seconds a job is given to stop after Ctrl-C before it is killed.
STOP_SECONDS = 30


class Summary(dict):
    """A finished job's summary (``summary.json`` of ``oar launch``), keys also as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _flags(**flags):
    """Command-line flags from keyword arguments: ``servers=2`` is ``--servers 2``, ``hidden=[8,
    4]`` is ``--hidden 8,4``, ``shuffle=True`` is ``--shuffle``; None and False are left out."""
    out = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def run(args, quiet=False, progress=None):
    """Runs ``oar ARGS`` as a child process; returns its standard output. Its error output is
    passed to ``sys.stderr`` as it comes (unless ``quiet``); its progress lines go to
    ``progress`` (a :class:`oar.progress.Progress`); a failure raises :class:`oar.JobFailed`
    carrying oar's message."""
    command = [sys.executable, "-m", "oar", *[str(a) for a in args]]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    lines, errors = [], []
    try:

        def pump_stdout():
            for line in proc.stdout:
                if progress is not None and progress.line(line):
                    continue
                lines.append(line)
                if not quiet:
                    sys.stdout.write(line)

        reader = threading.Thread(target=pump_stdout, daemon=True)
        reader.start()
        for line in proc.stderr:
            errors.append(line)
            if not quiet:
                sys.stderr.write(line)
        reader.join()
        code = proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        raise
    finally:
        if progress is not None:
            progress.close()
    if code != 0:
        raise JobFailed(said_in(errors, f"exit status {code}"), exit_code=code, command=command)
    return "".join(lines)


def _stop(proc):
    """Stops a job as Ctrl-C at a terminal would: SIGINT (oar stops its children), then a kill."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _job_flag(job, folder):
    """``--config FILE`` for a :class:`Job`, a dict or a job file's path."""
    if job is None:
        return []
    if isinstance(job, (str, Path)):
        return ["--config", str(job)]
    path = Job(job).save(Path(folder) / "job.toml")
    return ["--config", str(path)]


def launch(job=None, *, train=None, test=None, servers=2, workers=2, logs=None, quiet=False, progress=None, **flags):
    """Runs a whole job on this machine, as ``oar launch``: ``servers`` servers and ``workers``
    trainers as processes. ``job`` is a :class:`Job`, a dict or a job file's path; every other
    keyword is a flag of ``oar launch`` (``mode="sync"``, ``output="out"``, ``passes=2``,
    ``hidden=[64, 32]``, ...). A progress bar is drawn (a tqdm bar if tqdm is installed, in a
    notebook too) unless ``progress=False`` (default: not when ``quiet``). Returns the job's
    :class:`Summary` (samples/s, AUC, each process's figures)."""
    with tempfile.TemporaryDirectory(prefix="oar-launch-") as tmp:
        logs = Path(logs) if logs is not None else Path(tmp) / "logs"
        args = ["launch", *_job_flag(job, tmp), "--servers", servers, "--workers", workers, "--logs", logs]
        args += _flags(train=train, test=test, **flags) + ["--no-progress", "--progress-lines"]
        run(args, quiet=quiet, progress=Progress(not quiet if progress is None else progress))
        return Summary(json.loads((logs / "summary.json").read_text()))


def train(job=None, *, train=None, test=None, quiet=False, **flags):
    """Trains locally in one process, as ``oar train`` without servers; every keyword is a flag
    of ``oar train`` (``output="out"``, ``passes=2``, ...). Returns what it printed."""
    with tempfile.TemporaryDirectory(prefix="oar-train-") as tmp:
        args = ["train", *_job_flag(job, tmp), *_flags(train=train, test=test, **flags)]
        return run(args, quiet=quiet)


def export(model, out, *, quiet=False, **flags):
    """Exports a saved model, as ``oar export``: ONNX graphs, the tables as safetensors, a
    manifest, into the folder ``out``; returns its path."""
    run(["export", "--model", model, "--out", out, *_flags(**flags)], quiet=quiet)
    return Path(out)


class Serving:
    """A running ``oar serve`` (KServe v2 over HTTP): ``url`` is its address; ``stop()`` (or the
    end of a ``with`` block) stops it. Waits up to ``wait`` seconds for it to listen."""

    def __init__(self, model, addr="127.0.0.1:0", wait=60, **flags):
        args = ["serve", "--model", model, "--addr", addr, *_flags(**flags)]
        self.child = Listening(args, "OAR_SERVE", wait, "oar serve")
        self.process = self.child.process
        self.url = "http://" + self.child.address

    def stop(self):
        """Stops the server."""
        self.child.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve(model, addr="127.0.0.1:0", **flags):
    """Serves a saved model over KServe v2, as ``oar serve``, until stopped: a :class:`Serving`,
    best used as ``with oar.serve("out") as server: ... server.url ...``."""
    return Serving(model, addr, **flags)
