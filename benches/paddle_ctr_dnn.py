"""PaddlePaddle's parameter-server CTR-DNN: the baseline `oar bench --paddle` runs beside oar.

The same model as examples/ctr_dnn.toml: 26 one-hot slots embedded (dim 10) beside 13
log-transformed integers, ReLU 400-400-400, one logit, log-loss; Adam (lr 1e-3) for the dense
layers and SparseAdaGradSGDRule (lr 0.05, initial_g2sum 3, bounds +-10) for the rows, which
`oar bench --paddle` gives oar's side too;
batch 512, one pass, async (`strategy.a_sync`). The table is `paddle.static.nn.sparse_embedding`,
the large-scale table Paddle's PS users train Criteo with: ids are 64-bit, nothing is hashed into
a fixed vocabulary.

Two commands:

    python paddle_ctr_dnn.py convert SRC_DIR DST_DIR
        Criteo TSV part files (SRC_DIR/train/*, SRC_DIR/test/*) to Paddle's MultiSlot text, done
        once before any timing so that Paddle's readers only `cat` (its fastest data path).
    python -m paddle.distributed.launch --server_num 2 --trainer_num 2 paddle_ctr_dnn.py \
        train DST_DIR THREADS
        One job; each trainer prints `PADDLE_RESULT {json}` (trainer 0 with the test AUC).
        PADDLE_CTR_DNN_DEBUG=1 prints the loss and the running AUC every 20 batches.

Written for PaddlePaddle 3.0.0 (3.3.1, the newest on PyPI, has no parameter-server mode in its
CPU wheel).
"""

import json
import math
import os
import re
import sys
import time
import zlib

SLOTS = 26
DENSE = 13
DIM = 10
HIDDEN = [400, 400, 400]
BATCH = 512
THRESHOLDS = 4095
HEX8 = re.compile(r"[0-9A-Fa-f]{8}")


def feature_id(slot, value):
    """A categorical value's id: (slot + 1) << 32 | its 8 hex digits; a missing value one of its
    own per slot; anything else a CRC of its bytes, tagged apart from both."""
    if not value:
        return (1 << 40) | slot
    if HEX8.fullmatch(value):
        return ((slot + 1) << 32) | int(value, 16)
    return (1 << 41) | (slot << 32) | zlib.crc32(value.encode())


def convert_line(line):
    """One Criteo line as MultiSlot text: label, 26 ids (`feature_id`), 13 floats (oar's own
    features: ln(1 + max(x, 0)), missing 0)."""
    f = line.rstrip("\r\n").split("\t")
    f += [""] * (1 + DENSE + SLOTS - len(f))
    out = ["1 %d" % int(f[0])]
    for s in range(SLOTS):
        out.append("1 %d" % feature_id(s, f[1 + DENSE + s]))
    dense = []
    for i in range(DENSE):
        v = f[1 + i]
        dense.append("%.6g" % math.log1p(max(int(v), 0)) if v else "0")
    out.append("%d %s" % (DENSE, " ".join(dense)))
    return " ".join(out) + "\n"


def convert(src, dst):
    for part in ("train", "test"):
        os.makedirs(os.path.join(dst, part), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(src, part))):
            with open(os.path.join(src, part, name)) as i, open(os.path.join(dst, part, name), "w") as o:
                for line in i:
                    if line.strip():
                        o.write(convert_line(line))


def network(paddle):
    label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
    ids = [paddle.static.data(name="C%d" % s, shape=[None, 1], dtype="int64") for s in range(1, SLOTS + 1)]
    dense = paddle.static.data(name="dense", shape=[None, DENSE], dtype="float32")
    embs = []
    for slot in ids:
        e = paddle.static.nn.sparse_embedding(
            input=slot,
            size=[1000001, DIM],
            param_attr=paddle.ParamAttr(name="embedding", initializer=paddle.nn.initializer.Uniform(-0.01, 0.01)),
        )
        embs.append(paddle.reshape(e, [-1, DIM]))
    x = paddle.concat(embs + [dense], axis=1)
    width = SLOTS * DIM + DENSE
    for h in HIDDEN + [1]:
        linear = paddle.nn.Linear(
            width, h, weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(std=1.0 / math.sqrt(width)))
        )
        x = linear(x)
        if h != 1:
            x = paddle.nn.functional.relu(x)
        width = h
    y = paddle.cast(label, "float32")
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(x, y))
    p = paddle.nn.functional.sigmoid(x)
    auc, _, stats = paddle.static.auc(
        input=paddle.concat([1 - p, p], axis=1), label=label, num_thresholds=THRESHOLDS, slide_steps=0
    )
    return [label] + ids + [dense], loss, auc, stats


def auc_from(pos, neg):
    """The AUC of paddle.static.auc's global buckets (as Paddle's metric helpers compute it)."""
    tp = fp = area = 0.0
    for i in range(len(pos) - 1, -1, -1):
        new_tp, new_fp = tp + pos[i], fp + neg[i]
        area += (new_fp - fp) * (tp + new_tp) / 2
        tp, fp = new_tp, new_fp
    return area / (tp * fp) if tp > 0 and fp > 0 else float("nan")


def files(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def lines(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += sum(1 for _ in f)
    return n


def wait_for_servers(seconds=120):
    """Paddle's trainer gives up after three refused connections to a server still building its
    program (seen at 2 x 2 on one machine), so each trainer first waits until every server listens."""
    import socket

    deadline = time.time() + seconds
    for endpoint in os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","):
        host, port = endpoint.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("server %s not listening after %d s" % (endpoint, seconds))
                time.sleep(0.1)


def dataset(paddle, feeds, paths, threads):
    d = paddle.distributed.QueueDataset()
    d.init(use_var=feeds, pipe_command="cat", batch_size=BATCH, thread_num=threads)
    d.set_filelist(paths)
    return d


def train(folder, threads):
    # Paddle 3's new program form (PIR) has no parameter-server passes: PS jobs run the old one.
    os.environ.setdefault("FLAGS_enable_pir_api", "0")
    # The executor's places, one per reader thread (as PaddleRec's trainer sets it).
    os.environ["CPU_NUM"] = str(threads)
    import numpy as np
    import paddle
    import paddle.distributed.fleet as fleet

    paddle.enable_static()
    fleet.init()
    feeds, loss, auc, stats = network(paddle)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    # The rows' rule `oar bench --paddle` gives oar's side too, Paddle's SparseAdaGradSGDRule at
    # lr 0.05 (Paddle's default would follow the dense Adam, at its lr of 1e-3).
    table = "table_parameters.embedding.accessor."
    strategy.sparse_table_configs = {
        "embedding": {
            table + part + "_sgd_param." + key: value
            for part in ("embed", "embedx")
            for key, value in (("name", "SparseAdaGradSGDRule"), ("adagrad.learning_rate", 0.05))
        }
    }
    fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=1e-3), strategy).minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    wait_for_servers()
    fleet.init_worker()
    mine = fleet.util.get_file_shard(files(os.path.join(folder, "train")))
    started = time.time()
    exe.train_from_dataset(
        program=paddle.static.default_main_program(),
        dataset=dataset(paddle, feeds, mine, threads),
        fetch_list=[loss, auc] if os.environ.get("PADDLE_CTR_DNN_DEBUG") else None,
        fetch_info=["loss", "auc"] if os.environ.get("PADDLE_CTR_DNN_DEBUG") else None,
        print_period=20,
    )
    seconds = time.time() - started
    # Both trainers' passes end before the test, as oar's trainers wait for each other.
    fleet.barrier_worker()
    scope = paddle.static.global_scope()

    def counted():
        """Samples the AUC's buckets hold: what this trainer's program ran, counted by Paddle."""
        return int(sum(np.array(scope.find_var(v.name).get_tensor()).sum() for v in stats[2:]))

    result = {"trainer": fleet.worker_index(), "lines": lines(mine), "samples": counted(), "train_seconds": seconds}
    if fleet.worker_index() == 0:
        for var in stats:
            t = scope.find_var(var.name).get_tensor()
            t.set(np.zeros(np.array(t).shape, dtype=np.array(t).dtype), paddle.CPUPlace())
        test = files(os.path.join(folder, "test"))
        exe.infer_from_dataset(program=paddle.static.default_main_program(), dataset=dataset(paddle, feeds, test, threads))
        pos = np.array(scope.find_var(stats[2].name).get_tensor()).reshape(-1)
        neg = np.array(scope.find_var(stats[3].name).get_tensor()).reshape(-1)
        result.update(test_samples=counted(), test_auc=auc_from(pos, neg))
    # NaN (an AUC over one class) as null: JSON has no NaN.
    result = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}
    print("PADDLE_RESULT " + json.dumps(result), flush=True)
    fleet.stop_worker()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: paddle_ctr_dnn.py convert SRC DST | train DIR THREADS")
