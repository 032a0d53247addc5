#!/usr/bin/env bash
# Long GPU work on a host that is recycled after about 30 s without a call and keeps nothing: run a list
# of commands one after another in the background, from a snapshot of the checkout (later calls refresh
# the working tree; the running commands keep theirs), and poll from calls that copy the results back.
#
#   bash scripts/gpu_background.sh start JOBS   # JOBS: a file, one shell command per line ('#' lines skipped),
#                                               # run in /tmp/snap with $R=/tmp/res; steps logged in /tmp/res/steps.log
#   bash scripts/gpu_background.sh poll SECONDS # wait up to SECONDS (less once every step ended), print the
#                                               # step log, copy /tmp/res into $OUT/res.tgz (every poll: a recycled
#                                               # host loses only what ran since the last one)
set -euo pipefail
res=${GPU_RES:-/tmp/res}
case ${1:-} in
  start)
    jobs=$(realpath "$2")
    rm -rf /tmp/snap && mkdir -p /tmp/snap "$res"
    tar --exclude=./.gpu --exclude=./.git -cf - . | tar -xf - -C /tmp/snap   # the uploads stay where they are
    cp "$jobs" "$res/jobs.txt"
    # a session of its own: the device's run call ends its session's processes when the call returns
    setsid bash /tmp/snap/scripts/gpu_background.sh steps < /dev/null > /dev/null 2>&1 &
    echo "started: $(grep -cv '^\(#\|$\)' "$jobs") steps from $2, results in $res"
    ;;
  steps)  # (start's background part) the jobs in order, each step's output and exit status logged
    cd /tmp/snap
    export R=$res PYTHONUNBUFFERED=1
    n=0
    while IFS= read -r line; do
      [[ -z $line || $line == \#* ]] && continue
      n=$((n + 1))
      echo "== $n start $(date +%T): $line" >> "$res/steps.log"
      bash -c "$line" > "$res/step$n.log" 2>&1 && rc=0 || rc=$?
      echo "== $n rc=$rc $(date +%T)" >> "$res/steps.log"
    done < "$res/jobs.txt"
    echo "== all done $(date +%T)" >> "$res/steps.log"
    ;;
  poll)
    end=$(( $(date +%s) + ${2:-120} ))
    while (( $(date +%s) < end )) && ! grep -q "^== all done" "$res/steps.log" 2>/dev/null; do sleep 5; done
    tail -n 6 "$res/steps.log" 2>/dev/null || echo "no steps yet"
    if [ -n "${OUT:-}" ]; then tar -C "$(dirname "$res")" -czf "$OUT/res.tgz" "$(basename "$res")"; fi
    ;;
  *)
    echo "usage: $0 start JOBS | poll SECONDS" >&2
    exit 2
    ;;
esac
