"""oar's tables from Python (numpy only), against real `oar pserver` processes: what a push
does to the rows is what the optimizer says, counted where the servers applied it; sync steps
of two trainers; credentials proving one trainer and no other; hostile arrays and numbers
refused with a message (a NaN by the servers, counted there); a missing server named within the timeout."""

import os
import socket
import threading

import numpy as np
import pytest

import oar
from oar.errors import ConfigError, OarError

SGD = {"kind": "sgd", "lr": 0.5}


def spec(dim=4, dense=0, init=None):
    table = {"name": "emb", "dim": dim, "init": init or {"kind": "zeros"}, "optimizer": SGD}
    out = {"tables": [table], "dense_optimizer": SGD}
    if dense:
        out["dense"] = [{"name": "w", "len": dense, "init": {"kind": "constant", "value": 1.0}}]
    return out


def connect(servers, trainer=0, **kw):
    return oar.Tables(servers.addresses, kw.pop("spec", spec()), trainer=trainer, job=servers.job,
                      secret_file=servers.credential(trainer), **kw)


def applied(tables):
    """Samples applied per trainer, summed over servers: counted where they were applied."""
    per = [s["applied_samples"] for s in tables.stats()]
    return [sum(p[t] for p in per) for t in range(len(per[0]))]


def test_a_push_moves_the_rows_as_the_optimizer_says_and_the_servers_count_it():
    with oar.Servers(2, trainers=1, mode="async", job="t1") as servers:
        tables = connect(servers, spec=spec(dim=3, dense=5))
        ids = np.array([7, 1 << 40, 3, 2**64 - 1], dtype=np.uint64)
        rows, version = tables.pull("emb", ids)
        assert rows.shape == (4, 3) and rows.dtype == np.float32 and not rows.any() and version == 0
        dense, _ = tables.pull_dense()
        assert dense.tolist() == [1.0] * 5
        grads = np.arange(12, dtype=np.float32).reshape(4, 3)
        counts = np.array([[1, 0], [2, 1], [1, 1], [3, 0]], dtype=np.float32)
        discarded, staleness = tables.push({"emb": (ids, grads, counts)}, base_version=version, samples=2,
                                           dense=np.full(5, 4.0, dtype=np.float32))
        assert (discarded, staleness) == (0, 0)
        rows, version = tables.pull("emb", ids)
        # SGD over sums of 2 samples: w -= lr * g / 2.
        np.testing.assert_array_equal(rows, -0.5 * grads / 2)
        np.testing.assert_array_equal(tables.pull_dense()[0], np.full(5, 1.0 - 0.5 * 4.0 / 2))
        assert version == 1 and tables.position == (1, 1)
        # Peeking at an unknown id creates nothing.
        rows, _ = tables.pull("emb", np.array([99], dtype=np.uint64), create=False)
        assert not rows.any()
        assert sum(sum(s["rows"]) for s in tables.stats()) == 4
        assert tables.end_pass() == 1 and tables.position == (1, 2)
        assert applied(tables) == [2 * 2]  # each server applied the step's 2 samples
        tables.close()
        tables.close()  # again: nothing
        servers.wait(60)


def test_a_step_sums_each_id_with_its_shows_and_clicks_and_pushes_once():
    with oar.Servers(1, trainers=1, job="t2") as servers:
        tables = oar.Tables(servers.addresses, spec(dim=2), trainer=0, job="t2",
                            secret_file=servers.credential(0))
        ids = np.array([[5, 6], [5, 5]], dtype=np.int64)
        with tables.step(labels=[1, 0], reduction="sum") as step:
            lookup = oar.tables.Lookup(tables, "emb", ids)
            assert lookup.uniq.tolist() == [5, 6] and lookup.inverse.tolist() == [0, 1, 0, 0]
            assert lookup.counts.tolist() == [[3, 1], [1, 1]]  # id 5: 3 shows, 1 in a clicked sample
            lookup.grad(np.array([[1, 1], [2, 2]], dtype=np.float32))
            step.add("emb", np.array([6], dtype=np.uint64), np.array([[10, 10]], dtype=np.float32), [[1, 0]])
        assert step.result == (0, 0)
        rows, _ = tables.pull("emb", np.array([5, 6], dtype=np.uint64))
        np.testing.assert_array_equal(rows, -0.5 * np.array([[1, 1], [12, 12]], dtype=np.float32) / 2)
        with pytest.raises(OarError, match="pulled nothing"):
            with tables.step(samples=1):
                pass
        with pytest.raises(ValueError, match="a lookup of 2 samples in a step of 1 labels"):
            with tables.step(labels=[1]):
                oar.tables.Lookup(tables, "emb", ids)
        assert tables.position[0] == 1  # neither failed step pushed
        tables.close()


def test_two_trainers_in_sync_make_one_update_per_step():
    with oar.Servers(2, trainers=2, mode="sync", job="t3") as servers:
        conns = [connect(servers, t) for t in range(2)]
        ids = np.arange(10, dtype=np.uint64)

        def train(t):
            for _ in range(5):
                rows, version = conns[t].pull("emb", ids)
                grads = np.full((10, 4), t + 1, dtype=np.float32)
                conns[t].push({"emb": (ids, grads, np.ones((10, 2), np.float32))}, base_version=version, samples=1)
            conns[t].end_pass()

        threads = [threading.Thread(target=train, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert [s["version"] for s in conns[0].stats()] == [5, 5]
        assert applied(conns[0]) == [5 * 2, 5 * 2]
        # Each step: both trainers' sums merged over their 2 samples: w -= 0.5 * (1 + 2) / 2.
        rows, _ = conns[0].pull("emb", ids)
        np.testing.assert_allclose(rows, np.full((10, 4), -5 * 0.5 * 3 / 2), rtol=1e-6)
        for c in conns:
            c.close()
        servers.wait(60)


def test_a_credential_proves_its_own_trainer_only():
    with oar.Servers(1, trainers=2, job="t4") as servers:
        with pytest.raises(OarError, match="credential .* is trainer 1's, this process is trainer 0"):
            oar.Tables(servers.addresses, spec(), trainer=0, job="t4", secret_file=servers.credential(1))
        with pytest.raises(OarError, match="for job 't4', this process is of job 'other'"):
            oar.Tables(servers.addresses, spec(), trainer=0, job="other", secret_file=servers.credential(0))
        with pytest.raises(OarError):  # no credential: the servers refuse the handshake
            oar.Tables(servers.addresses, spec(), trainer=0, job="t4", connect_timeout=5)
        tables = connect(servers, 0)
        with pytest.raises(OarError, match="trainer 5 is not in 0..2|trainer 5"):
            oar.Tables(servers.addresses, spec(), trainer=5, job="t4", secret_file=servers.credential(0))
        tables.close()


def test_hostile_arrays_and_numbers_are_refused_with_a_message():
    with oar.Servers(1, trainers=1, job="t5") as servers:
        with pytest.raises(ConfigError, match="unknown field"):
            connect(servers, spec={"tabels": []})
        with pytest.raises(ConfigError, match="two tables are named"):
            connect(servers, spec={"tables": [{"name": "a", "dim": 1}, {"name": "a", "dim": 2}]})
        with pytest.raises(ConfigError, match="dim 0"):
            connect(servers, spec={"tables": [{"name": "a", "dim": 0}]})
        tables = connect(servers)
        ids = np.array([1, 2], dtype=np.uint64)
        _, version = tables.pull("emb", ids)
        ones = np.ones((2, 2), dtype=np.float32)
        with pytest.raises(ValueError, match="no table 'nope'"):
            tables.pull("nope", ids)
        with pytest.raises(ValueError, match="take gradients \\[2, 4\\]"):
            tables.push({"emb": (ids, np.ones((2, 3), np.float32), ones)}, base_version=version, samples=1)
        with pytest.raises(ValueError, match="C-contiguous"):
            tables.push({"emb": (ids, np.asfortranarray(np.ones((2, 4), np.float32)), ones)}, base_version=version, samples=1)
        with pytest.raises(TypeError):
            tables.push({"emb": (ids, np.ones((2, 4)), ones)}, base_version=version, samples=1)  # float64
        with pytest.raises(ValueError, match="dense: 3 floats, the servers keep 0"):
            tables.push({}, base_version=version, samples=1, dense=np.ones(3, np.float32))
        nan = np.full((2, 4), np.nan, dtype=np.float32)
        with pytest.raises(OarError, match="holds a NaN, an infinity or a value beyond"):
            tables.push({"emb": (ids, nan, ones)}, base_version=version, samples=1)
        stats = tables.stats()[0]
        assert stats["nonfinite"] == [1] and stats["applied_samples"] == [0]
        rows, _ = tables.pull("emb", ids)
        assert np.isfinite(rows).all()  # the NaN push was refused, the rows untouched
        tables.close()


def test_a_server_that_does_not_answer_is_named_within_the_timeout():
    quiet = socket.socket()
    quiet.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % quiet.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(OarError, match=address):
        oar.Tables([address], spec(), trainer=0, connect_timeout=1)
    for wait in (float("nan"), -1.0, 1e300, 1e15):  # none of them a wait, none a panic
        with pytest.raises(ValueError, match="connect_timeout: .* seconds; a wait is 0 to"):
            oar.Tables([address], spec(), trainer=0, connect_timeout=wait)
    quiet.close()


def test_servers_that_cannot_start_say_why():
    with pytest.raises(oar.JobFailed, match="--lag-ratio|lag"):
        oar.Servers(1, lag_ratio="many")


def test_a_forked_process_is_refused_the_parents_connection():
    with oar.Servers(1, trainers=1, job="t6") as servers:
        tables = connect(servers)
        pid = os.fork()
        if pid == 0:  # the child: a DataLoader worker would be one
            try:
                tables.pull("emb", np.array([1], dtype=np.uint64))
                os._exit(1)
            except OarError as e:
                os._exit(0 if "connect anew in a forked process" in str(e) else 2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        rows, _ = tables.pull("emb", np.array([1], dtype=np.uint64))  # the parent's still works
        assert rows.shape == (1, 4)
        tables.close()
