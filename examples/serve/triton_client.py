#!/usr/bin/env python3
"""Score a data file against `oar serve` with NVIDIA's tritonclient, writing what `oar predict` writes.

    triton_client.py --url HOST:PORT --data FILE --out FILE [--model NAME] [--version V]
                     [--json] [--batch-size N] [--wait SECONDS]
    triton_client.py --url HOST:PORT --request FILE.json --out FILE [--model NAME] [--version V] [--json]
    triton_client.py --url HOST:PORT --describe [--model NAME] [--version V]

The data lines go as they are, in the job's format, as the BYTES input `lines`: oar serve reads
them with the job's own parser, so no client-side id hashing is needed. One output line per
input line: every head's score, tab-separated, in the heads' order.

By default tritonclient sends tensors and asks for outputs in KServe's binary tensor format;
`--json` sends and asks for JSON instead. The server may still be starting: the client waits
up to `--wait` seconds (30) for it to answer ready. `--version` names the model version (the pass served,
as the model's metadata lists it) in every URL. `--request` sends the tensors of a saved v2 JSON
request (typed tensors: `dense`, `SLOT.ids`, ...) as numpy arrays. `--describe` prints, as JSON,
what the server says of itself and of the model: metadata, readiness, configuration, statistics
and the repository index.

Needs tritonclient (pip install "tritonclient[http]").
"""

import argparse
import json
import sys
import time

import numpy as np
import tritonclient.http as httpclient

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "UINT64": np.uint64,
          "INT32": np.int32, "UINT32": np.uint32, "BYTES": np.object_}


def wait_until_ready(client, args):
    """Waits up to --wait seconds for the server to answer ready (it may still be starting)."""
    deadline = time.monotonic() + args.wait
    while True:
        try:
            if client.is_server_ready():
                return
            why = "it answered not ready"
        except Exception as e:  # refused while the server starts, among others
            why = str(e) or type(e).__name__
        if time.monotonic() > deadline:
            sys.exit(f"triton_client.py: no server ready at {args.url} within {args.wait} s ({why})")
        time.sleep(0.2)


def outputs_of(client, args):
    """The model's output names (its metadata), and the outputs to ask for: tritonclient's
    default (none named: all of them, binary) unless --json asks for JSON."""
    meta = client.get_model_metadata(args.model, args.version)
    names = [o["name"] for o in meta["outputs"]]
    if not args.json:
        return names, None
    return names, [httpclient.InferRequestedOutput(n, binary_data=False) for n in names]


def infer(client, args, inputs, requested):
    return client.infer(args.model, inputs, model_version=args.version, outputs=requested)


def lines_input(lines, binary):
    data = np.array([line.encode() for line in lines], dtype=np.object_)
    tensor = httpclient.InferInput("lines", [len(lines)], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def tensor_input(t, binary):
    data = np.array(t["data"], dtype=DTYPES[t["datatype"]]).reshape(t["shape"])
    tensor = httpclient.InferInput(t["name"], list(t["shape"]), t["datatype"])
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def score_rows(result, names):
    """Per sample, every head's score."""
    columns = [result.as_numpy(n).reshape(-1) for n in names]
    return list(zip(*columns))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="oar serve's address, HOST:PORT")
    p.add_argument("--model", default="oar", help="the model's name (oar serve --name)")
    p.add_argument("--version", default="", help="the model version to name in the URLs (default: none)")
    p.add_argument("--data", help="data lines in the job's format")
    p.add_argument("--request", help="a v2 JSON infer request whose tensors to send")
    p.add_argument("--out", help="where the scores go")
    p.add_argument("--json", action="store_true", help="send and receive JSON, not binary tensors")
    p.add_argument("--batch-size", type=int, default=256, help="lines per request")
    p.add_argument("--describe", action="store_true", help="print what the server says of the model")
    p.add_argument("--wait", type=float, default=30, help="seconds to wait for the server to be ready")
    args = p.parse_args()

    client = httpclient.InferenceServerClient(url=args.url)
    wait_until_ready(client, args)
    if args.describe:
        said = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "server": client.get_server_metadata(),
            "model_ready": client.is_model_ready(args.model, args.version),
            "metadata": client.get_model_metadata(args.model, args.version),
            "config": client.get_model_config(args.model, args.version),
            "stats": client.get_inference_statistics(args.model, args.version),
            "index": client.get_model_repository_index(),
        }
        json.dump(said, sys.stdout, indent=1)
        print()
        return

    names, requested = outputs_of(client, args)
    rows = []
    if args.request:
        with open(args.request) as f:
            request = json.load(f)
        inputs = [tensor_input(t, not args.json) for t in request["inputs"]]
        rows = score_rows(infer(client, args, inputs, requested), names)
    else:
        with open(args.data) as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        for at in range(0, len(lines), args.batch_size):
            batch = lines[at:at + args.batch_size]
            rows += score_rows(infer(client, args, [lines_input(batch, not args.json)], requested), names)
    with open(args.out, "w") as out:
        for row in rows:
            out.write("\t".join(repr(float(v)) for v in row) + "\n")


if __name__ == "__main__":
    main()
