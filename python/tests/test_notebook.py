"""The example notebook (examples/python/tour.ipynb) runs from top to bottom in a real Jupyter
kernel (nbclient, ipykernel), in a scratch folder: it launches, watches, predicts and exports."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_notebook_runs(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    pytest.importorskip("pandas")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    notebook = nbformat.read(ROOT / "examples/python/tour.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    printed = json.dumps([c.get("outputs", []) for c in notebook.cells])
    assert "test AUC" in printed and "model.onnx" in printed, printed[:2000]
    assert "100%" in printed, "the launch drew its progress in the notebook"
