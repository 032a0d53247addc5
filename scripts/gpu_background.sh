#!/usr/bin/env bash
# Long GPU work on a host that is recycled after about 30 s without a call and keeps nothing: run a list
# of commands one after another in the background, from a snapshot of the checkout (later calls refresh
# the working tree; the running commands keep theirs), and poll from calls that copy the results back.
#
#   bash scripts/gpu_background.sh start JOBS   # JOBS: a file, one shell command per line ('#' lines skipped),
#                                               # run in /tmp/snap with $R=/tmp/res; steps logged in /tmp/res/steps.log
#   bash scripts/gpu_background.sh poll SECONDS # wait up to SECONDS (less once every step ended), print the
#                                               # step log, copy /tmp/res into $OUT/res.tgz (every poll: a recycled
#                                               # host loses only what ran since the last one) and, once, the
#                                               # compile caches a step packed (scripts/gpu_caches.sh)
#   bash scripts/gpu_background.sh check JOBS   # here, before asking for a GPU: each benchmark step of JOBS
#                                               # (bench_es_generation.py, not --phase table) run with --dry-run
#                                               # ($R a temporary folder); exit 1 if any would be refused
set -euo pipefail
res=${GPU_RES:-/tmp/res}
snap=${GPU_SNAP:-/tmp/snap}                 # the checkout's snapshot the steps run in
caches=${CACHES_OUT:-/tmp/caches-out}       # where scripts/gpu_caches.sh pack leaves its parts
# a jobs file's steps: its lines but blank ones and '#' comments, each newline-terminated (a last line without
# one was counted by start and then skipped by the steps' read loop)
step_lines() { grep -v -e '^#' -e '^$' "$1" || true; }
case ${1:-} in
  start)
    jobs=$(realpath "$2")
    rm -rf "$snap" && mkdir -p "$snap" "$res"
    tar --exclude=./.gpu --exclude=./.git -cf - . | tar -xf - -C "$snap"   # the uploads stay where they are
    cp "$jobs" "$res/jobs.txt"
    # a session of its own: the device's run call ends its session's processes when the call returns
    setsid bash "$snap/scripts/gpu_background.sh" steps < /dev/null > /dev/null 2>&1 &
    echo "started: $(step_lines "$jobs" | wc -l) steps from $2, results in $res"
    ;;
  steps)  # (start's background part) the jobs in order, each step's output and exit status logged
    cd "$snap"
    export R=$res PYTHONUNBUFFERED=1
    n=0
    while IFS= read -r line; do
      n=$((n + 1))
      echo "== $n start $(date +%T): $line" >> "$res/steps.log"
      # each output line stamped with the time it was written: where a step's minutes went (engine starts)
      set +e
      bash -c "$line" < /dev/null 2>&1 | while IFS= read -r out_line || [ -n "$out_line" ]; do
        printf '%(%T)T %s\n' -1 "$out_line"
      done > "$res/step$n.log"
      rc=${PIPESTATUS[0]}
      set -e
      echo "== $n rc=$rc $(date +%T)" >> "$res/steps.log"
    done < <(step_lines "$res/jobs.txt")
    echo "== all done $(date +%T)" >> "$res/steps.log"
    ;;
  poll)
    end=$(( $(date +%s) + ${2:-120} ))
    while (( $(date +%s) < end )) && ! grep -q "^== all done" "$res/steps.log" 2>/dev/null; do sleep 5; done
    tail -n 6 "$res/steps.log" 2>/dev/null || echo "no steps yet"
    if [ -n "${OUT:-}" ]; then
      tar -C "$(dirname "$res")" -czf "$OUT/res.tgz" "$(basename "$res")"
      # the compile caches once packed (scripts/gpu_caches.sh pack, a step of the jobs), sent back once
      if ls "$caches"/caches.tgz.part_* > /dev/null 2>&1 && [ ! -f "$caches/.sent" ]; then
        cp "$caches"/caches.tgz.part_* "$OUT/" && touch "$caches/.sent" && echo "caches sent"
      fi
    fi
    ;;
  check)  # a refused argument costs a GPU host's whole start; here it costs a second (2026-12-07)
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
    bench=benchmarks/bench_es_generation.py
    n=0 bad=0
    while IFS= read -r line; do
      n=$((n + 1))
      [[ $line == *"$bench"* && $line != *"--phase table"* ]] || continue
      cmd="python3 $bench${line#*"$bench"}"   # the host's set-up (gpu_lowrank_setup.sh) dropped: only the arguments count
      if [[ $cmd == *[\;\&\|\>\<]* ]]; then
        echo "step $n: cannot dry-run (a redirection or a second command after the benchmark): $line"; bad=$((bad + 1)); continue
      fi
      if R=$tmp bash -c "$cmd --dry-run" > "$tmp/out" 2>&1; then
        echo "step $n: ok"
      else
        echo "step $n: refused: $(grep -m1 'error:' "$tmp/out" || tail -n 1 "$tmp/out")"; bad=$((bad + 1))
      fi
    done < <(step_lines "$2")
    echo "checked $n steps of $2: $bad refused"
    (( bad == 0 ))
    ;;
  *)
    echo "usage: $0 start JOBS | poll SECONDS | check JOBS" >&2
    exit 2
    ;;
esac
