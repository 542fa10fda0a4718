#!/usr/bin/env bash
# The reference (FuxiCTR 2.3.10, see README.md) for every zoo model: 2 splits x seeds 1..5 on
# the real Criteo lines of ../shared, printed like examples/zoo/seeds.sh:
#   MODEL split A: a1 a2 a3 a4 a5 mean M sd S     (sd: population, as seeds.sh)
# Each run's full-precision line goes to stderr.
#
#   examples/zoo/reference/run_all.sh [VARIANT [INIT [MODEL...]]]
#   VARIANT: graph (default; oar's graphs from FuxiCTR layers) or class (FuxiCTR's classes as shipped)
#   INIT:    library (default; FuxiCTR's initializers) or oar (oar's initializers)
#   PYTHON:  interpreter with torch + fuxictr (default /tmp/refenv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../../.."
lines=../shared/data/criteo/criteo_train_first10k.txt
[ -f "$lines" ] || { echo "skipped: $lines is absent"; exit 0; }
variant=${1:-graph}
init=${2:-library}
shift $(( $# < 2 ? $# : 2 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(lr fm wide_deep deepfm dcn dcn_v2 dlrm ffm xdeepfm autoint)
py=${PYTHON:-/tmp/refenv/bin/python}
for m in "${models[@]}"; do
    out=$("$py" examples/zoo/reference/run.py "$m" --variant "$variant" --init "$init" \
        --split A B --seed 1 2 3 4 5)
    echo "$out" >&2
    for split in A B; do
        echo "$out" | awk -v m="$m" -v s="$split" -v v="$variant" -v i="$init" '
            $5 == s { a[++n] = $10 }
            END { if (n == 0) exit 1; t = 0; q = 0; line = ""
                  for (k = 1; k <= n; k++) { t += a[k]; q += a[k] * a[k]; line = line sprintf(" %.4f", a[k]) }
                  mu = t / n; sd = q / n - mu * mu; sd = sd > 0 ? sqrt(sd) : 0
                  printf "%s (%s, %s init) split %s:%s  mean %.4f sd %.4f\n", m, v, i, s, line, mu, sd }'
    done
done
