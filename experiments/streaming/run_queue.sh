#!/usr/bin/env bash
# Keeps JOBS (default 2) commands of a queue file (one per line) running, in order: a command starts when fewer than
# JOBS runs of `onlinerec.rl.streaming.runner` are running and its --out_dir has no run.log yet (so restarting this
# script skips what has started). Each run logs to <out_dir>/run.log. A leading "python" runs this checkout's .venv.
# A line "continue <command with a larger --total_frames N>" extends a finished run in its folder once no run is
# going there (and it has an eval.json), logging to <out_dir>/continue-N.log.
set -u
queue=${1:-experiments/streaming/queue.txt}
jobs=${2:-2}
py=python
[ -x .venv/bin/python ] && py=$(pwd)/.venv/bin/python
while IFS= read -r cmd; do
  [ -z "$cmd" ] && continue
  out=$(sed -E 's/.*--out_dir ([^ ]+).*/\1/' <<<"$cmd")
  log=run.log
  if [[ $cmd == continue\ * ]]; then
    cmd=${cmd#continue }
    log=continue-$(sed -E 's/.*--total_frames ([^ ]+).*/\1/' <<<"$cmd").log
    while [ ! -e "$out/eval.json" ] || ps -eo args | grep -q -- "streaming.runner.*--out_dir $out\( \|\$\)"; do sleep 30; done
  fi
  [ -e "$out/$log" ] && continue
  while [ "$(ps -eo comm,args | awk '$1 ~ /^python/ && /onlinerec.rl.streaming.runner/' | wc -l)" -ge "$jobs" ]; do sleep 30; done
  mkdir -p "$out"
  (OMP_NUM_THREADS=1 bash -c "${cmd/#python /$py }" > "$out/$log" 2>&1; echo "$(date +%H:%M) exit $?: $out") &
  sleep 5
done < "$queue"
wait
