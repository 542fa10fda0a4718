"""A job's training curves: the ``metrics.csv`` its trainers wrote."""

import csv
from pathlib import Path

COLUMNS = ["trainer", "pass", "step", "samples", "seconds", "kind", "loss", "auc"]


def curves(path):
    """The points of a ``metrics.csv`` (or of the one in an output folder): a pandas DataFrame
    when pandas is installed, else a list of dicts. Columns: trainer, pass, step, samples,
    seconds, kind (steps, pass, all_trainers, test, next_day), loss, auc."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.csv"
    with open(path, newline="") as f:
        # A header line may repeat: a file written by an older oar, whose trainers could both
        # find it empty and both write the header.
        rows = [row for row in csv.DictReader(f) if row["trainer"] != "trainer"]
    for row in rows:
        for key in ("trainer", "pass", "step", "samples"):
            row[key] = int(row[key])
        for key in ("seconds", "loss", "auc"):
            row[key] = float(row[key]) if row[key] not in ("", "nan") else float("nan")
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows, columns=COLUMNS)
