#!/usr/bin/env bash
# Carry the GPU host's compile caches from one session's host to the next one's: every host starts bare,
# and its first engine compiled Triton kernels for about two minutes after its CUDA graphs were captured
# (vLLM's model runner warms its kernels up then: 1m44s-2m30s before the first request on a fresh host,
# 38 s on a host that had run an engine; docs/scaling.md#gpu-host-staging), besides torch.compile's own work.
#
#   bash scripts/gpu_caches.sh pack      # on the GPU host, after its engines ran: the caches into
#                                        # /tmp/caches-out/caches.tgz.part_* (15 MiB each, 3 at most),
#                                        # which `gpu_background.sh poll` then sends back once
#   bash scripts/gpu_caches.sh unpack    # on the next host (gpu_lowrank_setup.sh does it): what an upload
#                                        # folder placed in /tmp/caches, unpacked where it was found
#
# Here, between the two: the parts out of the call's folder (it also holds res.tgz), then cut with the rest:
#   mkdir -p .gpu/caches && cp /work/.device/K/caches.tgz.part_* .gpu/caches/
#   bash scripts/gpu_uploads.sh ... /tmp/caches:.gpu/caches
# What travels: Triton's kernel cache (keyed by each kernel's source, Triton's version and the GPU), Torch
# Inductor's (keyed by the graph it compiled) and vLLM's compile cache (keyed by the engine's settings and
# the source files the compiler traced); a stale entry is not found, never used.  Nothing is sent when the
# caches do not fit (the limit is printed): the next host then compiles as before.
# CACHES_OUT, CACHES_IN, CACHES_PART_MIB and CACHE_DIRS (absolute folders, space-separated) change the
# places and the size of a part (tests/test_gpu_host_scripts.py).
set -euo pipefail
out=${CACHES_OUT:-/tmp/caches-out}
in=${CACHES_IN:-/tmp/caches}
parts=3
part_mib=${CACHES_PART_MIB:-15}
read -r -a wanted <<< "${CACHE_DIRS:-$HOME/.triton/cache /tmp/torchinductor_$(whoami) $HOME/.cache/vllm/torch_compile_cache $HOME/.cache/flashinfer}"
case ${1:-} in
  pack)
    rm -rf "$out" && mkdir -p "$out"
    dirs=()
    for d in "${wanted[@]}"; do
      [ -d "$d" ] && dirs+=("${d#/}")
    done
    if [ ${#dirs[@]} -eq 0 ]; then echo "[caches] nothing to pack"; exit 0; fi
    du -sh "${dirs[@]/#//}" 2>/dev/null | sed 's/^/[caches] /'
    tar -C / -cf - "${dirs[@]}" | gzip -1 > "$out/caches.tgz"
    size=$(stat -c %s "$out/caches.tgz")
    if (( size > parts * part_mib * 1024 * 1024 )); then
      echo "[caches] $(( size / 1048576 )) MiB packed, over the $(( parts * part_mib )) MiB that come back: not sent"
      rm -rf "$out"
      exit 0
    fi
    (cd "$out" && split -b "${part_mib}M" caches.tgz caches.tgz.part_ && rm caches.tgz)
    echo "[caches] $(awk -v b="$size" 'BEGIN {printf "%.1f", b / 1048576}') MiB in $(ls "$out" | wc -l) parts under $out"
    ;;
  unpack)
    if [ -f "$in/.unpacked" ]; then exit 0; fi
    if ! ls "$in"/caches.tgz.part_* > /dev/null 2>&1; then echo "[caches] none uploaded"; exit 0; fi
    cat "$in"/caches.tgz.part_* | tar -C / -xzf -
    touch "$in/.unpacked"
    echo "[caches] unpacked $(cat "$in"/caches.tgz.part_* | wc -c | awk '{printf "%.1f", $1 / 1048576}') MiB"
    ;;
  *)
    echo "usage: $0 pack | unpack" >&2
    exit 2
    ;;
esac
