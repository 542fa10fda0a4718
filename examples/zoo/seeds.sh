#!/usr/bin/env bash
# A zoo model's test AUC over 5 seeds on the real Criteo lines of ../shared (local training, one
# pass): split A trains on the first 9,000 lines and tests on the next 1,000, split B trains on
# the last 9,000 and tests on the first 1,000. Prints each split's 5 AUCs, mean and standard
# deviation. With TRANSFORM (none, standardize or minmax) the job's dense_transform is replaced
# by it (scaling with the split's own training statistics, from oar data stats).
#
#   examples/zoo/seeds.sh JOB [TRANSFORM]
set -euo pipefail
cd "$(dirname "$0")/../.."
job=$(realpath "${1:?usage: seeds.sh JOB [TRANSFORM]}")
transform=${2:-}
oar=$(realpath "${OAR:-target/release/oar}")
lines=../shared/data/criteo/criteo_train_first10k.txt
[ -f "$lines" ] || { echo "skipped: $lines is absent"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -9000 "$lines" >"$work/a_train.txt"; tail -1000 "$lines" >"$work/a_test.txt"
tail -9000 "$lines" >"$work/b_train.txt"; head -1000 "$lines" >"$work/b_test.txt"
for split in a b; do
    grep -v '^dense_transform' "$job" >"$work/job.toml"
    if [ -n "$transform" ] && [ "$transform" != none ]; then
        "$oar" data stats --config "$work/job.toml" --data "$work/${split}_train.txt" --out "$work/stats.json" >/dev/null
        sed -i "s/^\[data\]/[data]\ndense_transform = \"$transform\"\ndense_stats = \"stats.json\"/" "$work/job.toml"
    elif [ -z "$transform" ]; then
        cp "$job" "$work/job.toml"
    fi
    aucs=()
    for seed in 1 2 3 4 5; do
        aucs+=("$("$oar" train --config "$work/job.toml" --train "$work/${split}_train.txt" \
            --test "$work/${split}_test.txt" --seed $seed --passes 1 --threads 1 2>&1 |
            grep -o 'test AUC [0-9.]*' | tail -1 | awk '{print $3}')")
    done
    echo "$(basename "$job") ${transform:-as shipped} split ${split^^}: ${aucs[*]}" |
        awk '{n = 0; s = 0; q = 0; for (i = NF - 4; i <= NF; i++) {n++; s += $i; q += $i * $i}
              m = s / n; printf "%s  mean %.4f sd %.4f\n", $0, m, sqrt(q / n - m * m)}'
done
