#!/usr/bin/env bash
# Runs the commands of a queue file (one per line), two at a time, each logging to its run folder's run.log.
# A leading "python" runs this checkout's virtual environment's (.venv) if there is one.
set -u
queue=${1:-experiments/streaming/queue.txt}
jobs=${2:-2}
python=python
[ -x .venv/bin/python ] && python=$(pwd)/.venv/bin/python
export PY="$python"
grep -v '^\s*$' "$queue" | xargs -d '\n' -P "$jobs" -I{} bash -c '
  cmd="${1/#python /$PY }"
  out=$(sed -E "s/.*--out_dir ([^ ]+).*/\1/" <<<"$cmd")
  mkdir -p "$out"
  OMP_NUM_THREADS=1 bash -c "$cmd" > "$out/run.log" 2>&1
  echo "$(date +%H:%M) exit $?: $out"' _ {}
