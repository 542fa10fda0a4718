#!/usr/bin/env bash
# A model against its baseline on the same lines, seed by seed: JOB and BASE each trained
# locally for one pass at batch 256 on one thread (so a seed's run is the same on any machine)
# at every seed; prints each seed's two test AUCs, each job's mean and standard deviation, and
# the paired difference JOB - BASE with its standard error (sd / sqrt(n)) and the seeds JOB
# wins. Each seed is one comparison on the same lines in the same order, so the standard
# error is that of the seeds' differences. docs/src/measurements/2026-11-models.md states AutoInt+'s margin over its DNN
# (autoint_base.toml) this way. Single-head jobs: the last test AUC printed is the one read.
#
#   examples/zoo/paired.sh JOB BASE DIR [SEED...]   (DIR: train/ and test/; seeds 1..5)
#   e.g. examples/zoo/paired.sh examples/zoo/autoint.toml examples/zoo/autoint_base.toml DIR $(seq 20)
set -euo pipefail
usage="usage: paired.sh JOB BASE DIR [SEED...]"
# Paths as given, from the caller's folder; then to the repository for the default binary.
job=$(realpath "${1:?$usage}")
base=$(realpath "${2:?$usage}")
dir=$(realpath "${3:?$usage}")
[ -z "${OAR:-}" ] || OAR=$(realpath "$OAR")
shift 3
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
cd "$(dirname "$0")/../.."
oar=$(realpath "${OAR:-target/release/oar}")
[ -d "$dir/train" ] && [ -d "$dir/test" ] || { echo "$dir: no train/ and test/ folders" >&2; exit 2; }
auc() {
    local out
    out=$("$oar" train --config "$1" --train "$dir/train" --test "$dir/test" --seed "$2" --passes 1 \
        --threads 1 --batch-size 256 2>&1) || { echo "$1, seed $2: $(tail -1 <<<"$out")" >&2; exit 1; }
    out=$(grep -o 'test AUC [0-9.]*' <<<"$out" | tail -1 | awk '{print $3}')
    [ -n "$out" ] || { echo "$1, seed $2: no test AUC in oar's output" >&2; exit 1; }
    echo "$out"
}
runs=""
for seed in "${seeds[@]}"; do
    a=$(auc "$job" "$seed")
    b=$(auc "$base" "$seed")
    line="seed $seed: $a $b"
    echo "$line"
    runs+="$line"$'\n'
done
printf "%s" "$runs" | awk -v a="$(basename "$job")" -v b="$(basename "$base")" '
    { n++; x[n] = $3; y[n] = $4; d[n] = $3 - $4 }
    function mean(v,   i, s) { s = 0; for (i = 1; i <= n; i++) s += v[i]; return s / n }
    function sd(v, m,   i, q) { q = 0; for (i = 1; i <= n; i++) q += (v[i] - m) ^ 2; return n > 1 ? sqrt(q / (n - 1)) : 0 }
    END {
        if (n == 0) exit 1
        mx = mean(x); my = mean(y); md = mean(d); s = sd(d, md); w = 0
        for (i = 1; i <= n; i++) if (d[i] > 0) w++
        printf "%s: mean %.4f sd %.4f\n", a, mx, sd(x, mx)
        printf "%s: mean %.4f sd %.4f\n", b, my, sd(y, my)
        printf "paired %s - %s: %+.4f, standard error %.4f, %d of %d seeds won\n", a, b, md, s / sqrt(n), w, n
    }'
