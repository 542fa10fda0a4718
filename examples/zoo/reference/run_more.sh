#!/usr/bin/env bash
# oar and the reference (FuxiCTR 2.3.10, see README.md) side by side for the sequence and
# multi-task models: DIN and the pooled-history DNN (examples/zoo/din.toml, din_base.toml) on
# `oar gen sequences` lines (data seed 1), MMoE and PLE (mmoe.toml, ple.toml) on census-income,
# 5 model seeds each, printed like examples/zoo/seeds.sh:
#   SIDE MODEL [HEAD] (INIT): a1 a2 a3 a4 a5  mean M sd S     (sd: population, as seeds.sh)
# Every run's line goes to stderr. oar's AUCs are exact (its saved model scored by `oar predict`,
# the AUC computed by pred_auc.py); its log's 4-decimal AUC is checked against them.
#
#   examples/zoo/reference/run_more.sh [din] [multitask]     (default: both)
#   OAR:    the oar binary (default target/release/oar)
#   PYTHON: interpreter with torch + fuxictr + scikit-learn (default /tmp/refenv/bin/python)
#   SEEDS:  model seeds (default "1 2 3 4 5")
set -euo pipefail
cd "$(dirname "$0")/../../.."
oar=${OAR:-target/release/oar}
py=${PYTHON:-/tmp/refenv/bin/python}
seeds=${SEEDS:-1 2 3 4 5}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(din multitask)
census=../shared/data/multitask/census-income.test.first10k.txt.gz
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ref=examples/zoo/reference
all="$work/all.txt"; : >"$all"

say() { echo "$*" >&2; echo "$*" >>"$all"; }

# oar_run JOB KIND TRAIN TEST SEED [EXTRA...]: trains, scores the test data with the saved
# model, prints the exact AUC of each head; fails if the log's rounded AUC disagrees.
oar_run() {
    local job=$1 kind=$2 train=$3 test=$4 seed=$5; shift 5
    rm -rf "$work/model"
    local log
    log=$("$oar" train --config "$job" --train "$train" --test "$test" --passes 1 --seed "$seed" \
        --threads 1 --output "$work/model" "$@" 2>&1) || { echo "$log" >&2; return 1; }
    "$oar" predict --model "$work/model" --data "$test" --out "$work/scores" --threads 1 --no-progress >/dev/null 2>&1
    local exact
    exact=$("$py" $ref/pred_auc.py "$kind" "$test" "$work/scores")
    # The log's `pass 1:` test AUC (single head) or `head NAME:` lines after it (several).
    local printed
    printed=$(echo "$log" | awk '/^pass 1:/ { on = 1; if (match($0, /test AUC [0-9.]+/)) print substr($0, RSTART + 9, RLENGTH - 9) }
                                 on && /head [a-z_]+:/ { if (match($0, /test AUC [0-9.]+/)) print substr($0, RSTART + 9, RLENGTH - 9) }' | xargs)
    "$py" -c '
import sys
exact = [float(v) for v in sys.argv[1].split()]
printed = [float(v) for v in sys.argv[2].split()]
if printed and (len(printed) < len(exact) or any(abs(a - b) > 6e-5 for a, b in zip(exact, printed[-len(exact):]))):
    sys.exit(f"exact AUCs {exact} disagree with the log {printed}")' "$exact" "$printed"
    echo "$exact"
}

summary() {  # lines "side model head init seed auc" -> seeds.sh-like lines
    awk '{ k = $1 " " $2 ($3 == "-" ? "" : " " $3) " (" $4 " init)"; if (!(k in n)) order[++m] = k
           n[k]++; v[k, n[k]] = $6 }
         END { for (i = 1; i <= m; i++) { k = order[i]; t = 0; q = 0; line = ""
                   for (j = 1; j <= n[k]; j++) { a = v[k, j]; t += a; q += a * a; line = line sprintf(" %.6f", a) }
                   mu = t / n[k]; sd = q / n[k] - mu * mu; sd = sd > 0 ? sqrt(sd) : 0
                   printf "%s:%s  mean %.6f sd %.6f\n", k, line, mu, sd } }' "$1"
}

for part in "${parts[@]}"; do
    case $part in
    din)
        "$oar" gen sequences --lines 100000 --test-lines 10000 --out "$work/seq" --seed 1 >&2
        for m in din din_base; do
            for s in $seeds; do
                t0=$(date +%s.%N)
                a=$(oar_run examples/zoo/$m.toml din "$work/seq/train" "$work/seq/test" "$s" --batch-size 256)
                say "oar $m - oar $s $a ($(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)") s)"
            done
        done
        for init in library oar; do
            "$py" $ref/run_din.py "$work/seq" --init "$init" --seed $seeds --batch-size 256 |
                while read -r m _ i _ s _ _ a rest; do say "reference $m - $i $s $a $rest"; done
        done
        ;;
    multitask)
        if [ ! -f "$census" ]; then echo "skipped: $census is absent" >&2; continue; fi
        gzip -dc "$census" >"$work/census.txt"  # oar's split: the first 8,000 lines, the last 2,000
        head -8000 "$work/census.txt" >"$work/census-train.txt"
        tail -2000 "$work/census.txt" >"$work/census-test.txt"
        for m in mmoe ple; do
            for s in $seeds; do
                t0=$(date +%s.%N)
                read -r inc mar < <(oar_run examples/zoo/$m.toml census "$work/census-train.txt" "$work/census-test.txt" "$s")
                dt=$(printf %.1f "$(echo "$(date +%s.%N) - $t0" | bc)")
                say "oar $m income oar $s $inc ($dt s)"
                say "oar $m marital oar $s $mar ($dt s)"
            done
        done
        for init in library oar; do
            "$py" $ref/run_multitask.py "$work/census-train.txt" "$work/census-test.txt" --init "$init" --seed $seeds |
                while read -r m _ i _ s _ inc _ mar rest; do
                    say "reference $m income $i $s $inc $rest"
                    say "reference $m marital $i $s $mar $rest"
                done
        done
        ;;
    *) echo "unknown part $part (din, multitask)" >&2; exit 2 ;;
    esac
done
summary "$all"
