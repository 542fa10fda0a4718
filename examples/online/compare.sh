#!/usr/bin/env bash
# Ten days of a drifting stream on 2 servers x 2 trainers, up to seven ways: unbounded tables, a
# capacity with a daily shrink, admission on the second sighting (within the rows' 30 days, or
# within one day: `_daily`), rows aged out after 3 unseen days, and that with admission on the
# second sighting (both ways). Prints each run's day table (next-day AUC, rows and peak memory
# per server). Usage: compare.sh WORK [LINES_PER_DAY]; VARIANTS="..." picks the runs.
set -euo pipefail
work=${1:?usage: compare.sh WORK [LINES_PER_DAY]}
lines=${2:-1500000}
here=$(cd "$(dirname "$0")" && pwd)
oar=${OAR:-oar}
[ -d "$work/stream" ] || "$oar" gen stream --days 10 --lines-per-day "$lines" --out "$work/stream"
for v in ${VARIANTS:-unbounded capped admit2 admit2_daily aged aged_admit2 aged_admit2_daily}; do
  echo "== $v"
  "$oar" launch --config "$here/ctr_dnn_$v.toml" --online "$work/stream" --days 20260101..20260110 \
    --logs "$work/logs-$v" --no-progress
done
