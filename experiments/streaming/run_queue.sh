#!/usr/bin/env bash
# Keeps JOBS (default 2) commands of a queue file (one per line) running, in order: a command starts when fewer than
# JOBS runs of `onlinerec.rl.streaming.runner` are running and its --out_dir has no run.log yet (so restarting this
# script skips what has started). Each run logs to <out_dir>/run.log. A leading "python" runs this checkout's .venv.
set -u
queue=${1:-experiments/streaming/queue.txt}
jobs=${2:-2}
py=python
[ -x .venv/bin/python ] && py=$(pwd)/.venv/bin/python
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  out=$(sed -E 's/.*--out_dir ([^ ]+).*/\1/' <<<"$cmd")
  [ -e "$out/run.log" ] && continue
  while [ "$(ps -eo comm,args | awk '$1 ~ /^python/ && /onlinerec.rl.streaming.runner/' | wc -l)" -ge "$jobs" ]; do sleep 30; done
  mkdir -p "$out"
  (OMP_NUM_THREADS=1 bash -c "${cmd/#python /$py }" > "$out/run.log" 2>&1; echo "$(date +%H:%M) exit $?: $out") &
  sleep 5
done < "$queue"
wait
