#!/usr/bin/env bash
# Load-test `oar serve` with wrk (KServe v2 infer requests of 1 and 256 raw Criteo lines), then
# time onnxruntime scoring the same batches in process (the export's model.onnx), on one
# machine. Prints one line per run; the serving table of docs/src/serving.md comes from it.
#
#   examples/serve/bench.sh WORKDIR [SECONDS]
#
# Needs wrk (Debian: apt-get install wrk) and a Python with onnxruntime, numpy and safetensors
# ($OAR_PYTHON, default python3). Trains the CTR-DNN on generated data in WORKDIR first if
# WORKDIR/model is absent.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:?usage: bench.sh WORKDIR [SECONDS]}
secs=${2:-10}
oar=${OAR:-target/release/oar}
py=${OAR_PYTHON:-python3}
mkdir -p "$work"
[ -d "$work/data" ] || "$oar" gen criteo --lines 200000 --test-lines 20000 --parts 1 --out "$work/data" >/dev/null
[ -d "$work/model" ] || "$oar" train --config examples/ctr_dnn.toml --train "$work/data/train" \
    --output "$work/model" --passes 1 >/dev/null
"$oar" export --model "$work/model" --out "$work/export" >/dev/null
test="$work/data/test/part-00000"

# Request bodies: the first B test lines as one BYTES input named `lines`.
for b in 1 256; do
    "$py" - "$test" "$b" >"$work/body$b.json" <<'EOF'
import json, sys
lines = [l.rstrip("\n") for _, l in zip(range(int(sys.argv[2])), open(sys.argv[1]))]
print(json.dumps({"inputs": [{"name": "lines", "shape": [len(lines)], "datatype": "BYTES", "data": lines}]}))
EOF
    cat >"$work/post$b.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$work/body$b.json")
wrk.body = f:read("*a")
f:close()
EOF
done

"$oar" serve --model "$work/model" --addr 127.0.0.1:0 >"$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    grep -q '^OAR_SERVE ' "$work/serve.log" 2>/dev/null && break
    kill -0 $server 2>/dev/null || { cat "$work/serve.log"; exit 1; }
    sleep 0.1
done
addr=$(sed -n 's/^OAR_SERVE //p' "$work/serve.log")
url="http://$addr/v2/models/oar/infer"

for b in 1 256; do
    for c in 1 4; do
        out=$(wrk -t1 -c$c -d${secs}s --latency -s "$work/post$b.lua" "$url")
        rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
        p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
        p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
        errors=$(grep -E "Non-2xx|Socket errors" <<<"$out" || true)
        echo "oar serve batch $b, $c connections: $rps requests/s, p50 $p50, p99 $p99${errors:+ ($errors)}"
    done
done
kill $server
for b in 1 256; do
    for t in 1 2; do
        echo -n "threads $t: "
        "$py" examples/serve/bench_onnxruntime.py --export "$work/export" --data "$test" --batch $b \
            --seconds "$secs" --threads $t
    done
done
