#!/bin/bash
# DeepFM 2 servers x 2 trainers async, three ways on the same data, seeds 1..3, the three
# alternating within each seed: oar's native job (examples/zoo/deepfm.toml), PaddleRec's own
# net.py with oar's embeddings (Paddle), and the same network in PyTorch on oar's tables.
#
#   examples/python/compare_deepfm.sh DATA PADDLEREC OUT
#
# DATA: train/ and test/ in Criteo format (../shared/tools/gen_criteo_synth.py --lines 1000000
# --seed 1 --parts 4 --out-dir DATA); PADDLEREC: a PaddleRec checkout (its models/rank/deepfm);
# OAR_PADDLE_PYTHON / OAR_TORCH_PYTHON: Pythons with oar-ps and Paddle / PyTorch and pandas;
# oar on the PATH. Each run's result is OUT/{native,paddle,torch}-SEED.json.
set -euo pipefail
data=$1 paddlerec=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for seed in 1 2 3; do
    oar launch --config "$here/../zoo/deepfm.toml" --train "$data/train" --test "$data/test" \
        --servers 2 --workers 2 --mode async --seed "$seed" --logs "$out/native-$seed" --no-progress >"$out/native-$seed.log" 2>&1
    cp "$out/native-$seed/summary.json" "$out/native-$seed.json"
    "$OAR_PADDLE_PYTHON" "$here/deepfm.py" --train "$data/train" --test "$data/test" --framework paddle \
        --paddlerec "$paddlerec" --seed "$seed" --out "$out/paddle-$seed.json" >"$out/paddle-$seed.log" 2>&1
    "$OAR_TORCH_PYTHON" "$here/deepfm.py" --train "$data/train" --test "$data/test" --framework torch \
        --seed "$seed" --out "$out/torch-$seed.json" >"$out/torch-$seed.log" 2>&1
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
for kind in ("native", "paddle", "torch"):
    runs = [json.load(open(f"{out}/{kind}-{s}.json")) for s in (1, 2, 3)]
    auc = [r["test"]["auc"] if kind == "native" else r["auc"] for r in runs]
    rate = [r["samples_per_sec"] if kind == "native" else r["samples_per_s"] for r in runs]
    print(f"{kind}: test AUC {' '.join(f'{a:.4f}' for a in auc)} (mean {statistics.mean(auc):.4f}); "
          f"samples/s {' '.join(f'{r:,.0f}' for r in rate)} (median {statistics.median(rate):,.0f})")
PY
