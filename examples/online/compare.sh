#!/usr/bin/env bash
# Ten days of a drifting stream on 2 servers x 2 trainers, five ways: unbounded tables, a
# capacity with a daily shrink, admission on the second sighting, rows aged out after 3 unseen
# days, and that with admission on the second sighting. Prints each run's day
# table (next-day AUC, rows and peak memory per server). Usage: compare.sh WORK [LINES_PER_DAY]
set -euo pipefail
work=${1:?usage: compare.sh WORK [LINES_PER_DAY]}
lines=${2:-1500000}
here=$(cd "$(dirname "$0")" && pwd)
oar=${OAR:-oar}
[ -d "$work/stream" ] || "$oar" gen stream --days 10 --lines-per-day "$lines" --out "$work/stream"
for v in ${VARIANTS:-unbounded capped admit2 aged aged_admit2}; do
  echo "== $v"
  "$oar" launch --config "$here/ctr_dnn_$v.toml" --online "$work/stream" --days 20260101..20260110 \
    --logs "$work/logs-$v" --no-progress
done
