#!/usr/bin/env python3
"""Time onnxruntime scoring an `oar export` in process, batch by batch: the baseline beside
`oar serve` under a load generator (examples/serve/bench.sh).

    bench_onnxruntime.py --export EXPORT --data FILE --batch 256 --seconds 10 [--threads 1]

Parses the batch once (as a client would before sending it), then runs the complete model
(model.onnx, lookups inside) on it again and again for --seconds, and prints one line:
`onnxruntime batch B: R runs/s, p50 X ms, p99 Y ms, S samples/s`.
"""

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_predict import Scorer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    a = ap.parse_args()
    scorer = Scorer(a.export, "model")
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    scorer.session = ort.InferenceSession(os.path.join(a.export, "model.onnx"), options)
    with open(a.data, "rb") as f:
        samples = [scorer.parser.parse(next(f).rstrip(b"\n")) for _ in range(a.batch)]
    feeds = scorer.feeds(samples)
    names = [h["output"] for h in scorer.manifest["heads"]]
    times = []
    end = time.perf_counter() + a.seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        scorer.session.run(names, feeds)
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1e3
    runs = len(times) / sum(times)
    print(
        f"onnxruntime batch {a.batch}: {runs:.0f} runs/s, p50 {np.percentile(ms, 50):.3f} ms, "
        f"p99 {np.percentile(ms, 99):.3f} ms, {runs * a.batch:.0f} samples/s"
    )


if __name__ == "__main__":
    main()
