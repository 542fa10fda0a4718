"""A saved model scored in this process: ``predict`` into numpy arrays, ``evaluate`` into
figures, from data files, data lines or a pandas DataFrame."""

from pathlib import Path

from . import _oar


def _files(data):
    if isinstance(data, (str, Path)):
        return [str(data)]
    return [str(d) for d in data]


def _lines(frame):
    """A DataFrame's rows as data lines: its columns in order, tab-separated, missing values
    empty (Criteo's and the plain format's layout)."""
    return frame.astype(object).where(frame.notna(), "").astype(str).agg("\t".join, axis=1).tolist()


def predict(model, data=None, *, lines=None, frame=None, batch_size=4096, threads=0, skip_bad_lines=False):
    """The scores ``oar predict`` writes for a saved model (its output folder or a pass folder),
    as a float32 array ``[samples, heads]`` in input order. The samples come from ``data`` (data
    files or folders, in the job's format), ``lines`` (a list of data lines) or ``frame`` (a
    pandas DataFrame whose columns are a line's fields, in order)."""
    given = [x is not None for x in (data, lines, frame)]
    if sum(given) != 1:
        raise ValueError("give one of data=FILES, lines=[...] or frame=DataFrame")
    if frame is not None:
        lines = _lines(frame)
    if lines is not None:
        return _oar.predict_lines(str(model), list(lines))
    return _oar.predict_files(str(model), _files(data), batch_size, threads, skip_bad_lines)


def evaluate(model, data, *, batch_size=4096, skip_bad_lines=False):
    """``oar eval``'s figures for a saved model on data files: per head, a dict of samples,
    loss, AUC (log-loss heads), predicted and actual rates."""
    return _oar.evaluate(str(model), _files(data), batch_size, skip_bad_lines)
