"""oar's Python package end to end, with real processes: a job launched from Python (its
servers and trainers running `python -m oar`), its model scored in process into numpy (equal to
`oar predict`'s file), evaluated, exported and served; job files as dicts checked by oar; failures
as exceptions with oar's messages; Ctrl-C stopping a job and everything it started."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import oar

ROOT = Path(__file__).resolve().parents[2]


def cli(*args):
    """`python -m oar ARGS`, checked; its standard output."""
    done = subprocess.run([sys.executable, "-m", "oar", *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Generated Criteo-format data and a CTR-DNN launched on it from Python, 2 x 2."""
    root = tmp_path_factory.mktemp("job")
    cli("gen", "criteo", "--lines", 8000, "--test-lines", 1000, "--parts", 2, "--out", root / "data")
    summary = oar.launch(
        train=root / "data/train", test=root / "data/test", servers=2, workers=2,
        output=root / "out", hidden=[16, 8], logs=root / "logs", quiet=True,
    )
    return root, summary


def test_the_command_line_is_the_binarys(tmp_path):
    assert cli("--version").startswith("oar ")
    assert "launch" in cli("--help")


def test_a_job_launched_from_python_runs_its_processes_as_python_and_reports(trained):
    root, summary = trained
    assert summary.workers == 2 and summary.servers == 2, summary
    assert summary["samples"] == 8000
    assert 0.5 < summary.test["auc"] < 1.0, summary.test
    # Counted by the servers (each holds a part of every sample's parameters): every sample
    # applied once on each.
    applied = [sum(s["applied_samples"]) for s in summary["server_stats"]]
    assert applied == [8000, 8000], summary["server_stats"]
    assert (root / "out" / "latest").exists()


def test_predict_in_process_equals_oar_predicts_file(trained):
    root, _ = trained
    test = root / "data/test"
    scores = oar.predict(root / "out", test)
    assert scores.dtype == np.float32 and scores.shape == (1000, 1)
    cli("predict", "--model", root / "out", "--data", test, "--out", root / "p.tsv", "--no-progress")
    written = np.loadtxt(root / "p.tsv", dtype=np.float32).reshape(-1, 1)
    assert np.array_equal(scores, written)
    lines = (test / "part-00000").read_text().splitlines()
    assert np.allclose(oar.predict(root / "out", lines=lines[:100]), scores[:100], atol=1e-6)
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_csv(test / "part-00000", sep="\t", header=None, nrows=50, dtype=str, keep_default_na=False)
    assert np.allclose(oar.predict(root / "out", frame=frame), scores[:50], atol=1e-6)


def test_evaluate_export_and_serve(trained):
    root, _ = trained
    figures = oar.evaluate(root / "out", root / "data/test")
    (head,) = figures.values()
    assert head["samples"] == 1000 and 0.5 < head["auc"] < 1.0, figures
    export = oar.export(root / "out", root / "export", quiet=True)
    assert {"model.onnx", "dense.onnx", "tables.safetensors", "manifest.json"} <= {p.name for p in export.iterdir()}
    lines = (root / "data/test/part-00000").read_text().splitlines()[:10]
    want = oar.predict(root / "out", lines=lines)[:, 0]
    with oar.serve(root / "out") as server:
        body = json.dumps({"inputs": [{"name": "lines", "shape": [10], "datatype": "BYTES", "data": lines}]})
        request = urllib.request.Request(server.url + "/v2/models/oar/infer", body.encode(), {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=60))
    assert np.allclose(answer["outputs"][0]["data"], want, atol=1e-6)
    assert server.process.poll() is not None, "the server stopped with the block"


def test_curves_come_as_a_table(trained):
    root, _ = trained
    points = oar.curves(root / "out")
    kinds = set(points["kind"]) if hasattr(points, "columns") else {p["kind"] for p in points}
    assert {"pass", "all_trainers", "test"} <= kinds


def test_curves_read_past_a_repeated_header(tmp_path):
    header = "trainer,pass,step,samples,seconds,kind,loss,auc\n"
    (tmp_path / "metrics.csv").write_text(header + header + "1,1,50,25600,1.5,steps,0.45,0.75\n")
    points = oar.curves(tmp_path)
    rows = points.to_dict("records") if hasattr(points, "columns") else points
    assert [(r["trainer"], r["step"], r["kind"]) for r in rows] == [(1, 50, "steps")]


def test_a_job_is_a_dict_that_oar_checks(tmp_path):
    job = oar.Job.load(ROOT / "examples/ctr_dnn.toml")
    assert job["train"]["batch_size"] > 0
    again = oar.Job.load(job.save(tmp_path / "job.toml"))
    assert again == job, "a job written and read back is the same job"
    job["train"]["batch_sizee"] = 3
    with pytest.raises(oar.ConfigError, match="batch_sizee") as refused:
        job.check()
    assert isinstance(refused.value, ValueError)
    with pytest.raises(oar.ConfigError, match="passes must be at least 1"):
        oar.Job({"train": {"passes": 0}}).check()


def test_a_failed_job_raises_with_oars_message(tmp_path):
    with pytest.raises(oar.JobFailed, match="no-such-folder") as failed:
        oar.launch(train=tmp_path / "no-such-folder", servers=1, workers=1, quiet=True)
    assert failed.value.exit_code == 1
    with pytest.raises(oar.OarError, match="no-such-model"):
        oar.predict(tmp_path / "no-such-model", tmp_path)
    with pytest.raises(oar.JobFailed, match="not a saved model"):
        oar.serve(tmp_path)


def test_ctrl_c_stops_a_launched_job_and_its_processes(tmp_path):
    """A Python process launching a long job gets SIGINT: it raises KeyboardInterrupt once the
    job's processes are gone, and none of them is left."""
    cli("gen", "criteo", "--lines", 400000, "--test-lines", 1000, "--parts", 2, "--out", tmp_path / "data")
    # Ctrl-C as at a terminal: a process started in the background of a non-interactive shell
    # inherits SIGINT ignored (Python then never raises KeyboardInterrupt), as CI's job may be.
    script = textwrap.dedent(f"""
        import oar, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            oar.launch(train={str(tmp_path / 'data/train')!r}, servers=1, workers=2, passes=50,
                       logs={str(tmp_path / 'logs')!r}, quiet=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(7)
    """)
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    # Wait until the job's last trainer is training (it logs "training trainer=1").
    log = tmp_path / "logs" / "worker.1.log"
    deadline = time.monotonic() + 120
    while not log.exists() or "training trainer=1" not in log.read_text():
        assert time.monotonic() < deadline, "the job did not start training within 120 s"
        assert job.poll() is None, "the job ended before it was interrupted"
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGINT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 7 and "interrupted" in out, (job.returncode, out)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "data/train")], capture_output=True, text=True).stdout
    assert left.strip() == "", f"processes left behind: {left}"


def test_a_model_built_in_python_is_the_job_files_model(tmp_path):
    """DeepFM built layer by layer equals examples/zoo/deepfm.toml's [model] once both are read
    by oar; a bad graph is refused with oar's message."""
    m = oar.Model(output="logit", loss="log_loss")
    v = m.table("v", dim=10, init={"kind": "uniform", "scale": 0.0002})
    w = m.table("w", dim=1)
    emb = m.embedding("emb", table=v, slots="C1..C26")
    wide = m.embedding("wide", table=w, slots="C1..C26")
    lr_s = m.reduce_sum("lr_s", wide, over="all")
    lr_d = m.linear("lr_d", m.dense, out=1, init="zeros")
    fm = m.fm("fm", emb)
    x = m.concat("x", [emb, m.dense])
    deep = m.mlp("deep", x, hidden=[400, 400, 400], out=1, init="xavier")
    m.add("logit", [lr_s, lr_d, fm, deep])
    file = oar.Job.load(ROOT / "examples/zoo/deepfm.toml")
    assert oar.Job(file, model=m).normalized() == file
    assert oar.Job.load(oar.Job(file, model=m).save(tmp_path / "deepfm.toml")) == file
    bad = oar.Model(output="y")
    bad.mlp("y", "nope", hidden=[4], out=1)
    with pytest.raises(oar.ConfigError, match="nope"):
        bad.check()
    with pytest.raises(AttributeError, match="no layer type 'mpl'"):
        bad.mpl("z", "y")


def slot_reader():
    """examples/paddlerec_reader.py's Reader (PaddleRec's rank/dnn reader), which subclasses
    oar.data.MultiSlotDataGenerator where oar's package is installed."""
    spec = importlib.util.spec_from_file_location("paddlerec_reader", ROOT / "examples/paddlerec_reader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert issubclass(module.Reader, oar.data.MultiSlotDataGenerator)
    return module.Reader


def test_a_multislot_reader_prints_paddles_text_and_refuses_what_paddle_refuses():
    reader = slot_reader()()
    line = "click:1 dense_feature:0.5 " + " ".join(f"{i}:{100 + i}" for i in range(1, 27)) + " dense_feature:0.25"
    (text,) = reader.multislot([line])
    fields = text.split()
    assert fields[:2] == ["1", "1"] and fields[-3:] == ["2", "0.5", "0.25"], text
    bad = oar.data.MultiSlotDataGenerator()
    for sample, says in [
        ([("a", [])], "is empty"),
        ([("a", ["7"])], "is a str"),
        ([("a", [np.int64(7)])], "not an int"),
    ]:
        with pytest.raises(ValueError, match=says):
            oar.data.MultiSlotDataGenerator()._text(sample)
    bad._text([("a", [1])])
    with pytest.raises(ValueError, match="field 'b' where the first sample had 'a'"):
        bad._text([("b", [1])])
    assert oar.data.MultiSlotDataGenerator(strict=False)._text([("a", []), ("b", [1.5])]) == "0 1 1.5\n"


def test_a_paddlerec_reader_as_pipe_command_trains_as_the_slot_file_itself(tmp_path):
    """PaddleRec's reader, run by oar as the job's pipe_command over PaddleRec's slot sample file,
    trains the model the file read directly trains: the same scores, bit for bit."""
    sample = ROOT.parent / "shared/data/criteo/paddlerec_slot_sample_train.txt"
    if not sample.exists():
        pytest.skip("../shared/data is absent (PaddleRec's slot sample file)")
    script = ROOT / "examples/paddlerec_reader.py"
    SlotReader = slot_reader()
    direct = oar.Job.load(ROOT / "examples/paddlerec_slots.toml")
    piped = oar.Job(direct, data={**direct["data"], "format": "multislot", "pipe_command": f"{sys.executable} {script}"})
    for name, job in [("direct", direct), ("piped", piped)]:
        oar.train(job, train=sample, output=tmp_path / name, quiet=True)
    want = oar.predict(tmp_path / "direct", lines=sample.read_text().splitlines())
    got = oar.predict(tmp_path / "piped", lines=list(SlotReader().lines(sample)))
    assert want.shape == (len(sample.read_text().splitlines()), 1)
    assert np.array_equal(got, want), "the piped job's model scores its reader's lines as the direct one the file's"


DNN_CONFIG = """
# PaddleRec's models/rank/dnn/config.yaml, as PaddleRec writes it
runner:
  train_data_dir: "data/train"
  train_reader_path: "criteo_reader"
  use_gpu: False
  use_auc: True
  train_batch_size: 16
  epochs: 3
  print_interval: 2
  model_save_path: "output_model_dnn"
  test_data_dir: "data/train"
  infer_reader_path: "criteo_reader"
  sync_mode: "async"
  thread_num: 1
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
    strategy: async
  sparse_inputs_slots: 27
  sparse_feature_number: 1000001
  sparse_feature_dim: 9
  dense_input_dim: 13
  fc_sizes: [512, 256, 128, 32]
  distributed_embedding: 0
"""


def test_a_paddlerec_config_is_read_as_the_zoo_job_and_runs(tmp_path):
    """PaddleRec's rank/dnn config.yaml gives examples/paddlerec_slots.toml's model and data
    (as oar reads both), its runner settings as flags, the keys left out with a reason, and runs
    on PaddleRec's slot sample file; deepfm and wide_deep build; what oar cannot run is refused."""
    sample = ROOT.parent / "shared/data/criteo/paddlerec_slot_sample_train.txt"
    if not sample.exists():
        pytest.skip("../shared/data is absent (PaddleRec's slot sample file)")
    folder = tmp_path / "models/rank/dnn"
    (folder / "data/train").mkdir(parents=True)
    (folder / "data/train/part-0").write_text(sample.read_text())
    (folder / "config.yaml").write_text(DNN_CONFIG)
    rec = oar.paddlerec.load(folder / "config.yaml")
    job, zoo = rec.job.normalized(), oar.Job.load(ROOT / "examples/paddlerec_slots.toml")
    assert (job["model"], job["data"]) == (zoo["model"], zoo["data"])
    assert (job["dense_optimizer"]["kind"], job["train"]["batch_size"], job["train"]["log_every"]) == ("adam", 16, 2)
    assert rec.flags == {"train": str(folder / "data/train"), "test": str(folder / "data/train"),
                         "output": str(folder / "output_model_dnn"), "mode": "async"}
    assert job["train"]["passes"] == 3
    assert rec.unused["runner.use_gpu"] == "oar trains on CPUs"
    summary = rec.launch(servers=1, workers=1, passes=1, quiet=True)
    lines = len(sample.read_text().splitlines())
    assert summary.samples == lines and [sum(s["applied_samples"]) for s in summary.server_stats] == [lines]
    for name in ("deepfm", "wide_deep"):
        oar.paddlerec.load(folder / "config.yaml", model=name).job.check()
    (folder / "config.yaml").write_text(DNN_CONFIG.replace('sync_mode: "async"', 'sync_mode: "heter"'))
    with pytest.raises(oar.ConfigError, match='runner.sync_mode "heter"'):
        oar.paddlerec.load(folder / "config.yaml")


def test_a_launch_draws_its_progress_and_keeps_the_lines_out_of_its_output(tmp_path, capsys):
    cli("gen", "criteo", "--lines", 2000, "--test-lines", 200, "--parts", 1, "--out", tmp_path / "data")
    oar.launch(train=tmp_path / "data/train", servers=1, workers=1, hidden=[4], logs=tmp_path / "logs")
    out, err = capsys.readouterr()
    assert "OAR_LAUNCH_PROGRESS" not in out + err
    assert "100%" in err, err[-2000:]
