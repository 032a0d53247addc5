#!/usr/bin/env bash
# Re-cut staged folders into upload folders that fit one `run` call: a call carries the checkout's working
# tree (about 8 MiB) together with the folders it names, 64 MiB in all, so the 58 MiB folders of
# ../shared/gpu/stage_vllm.sh and scripts/stage_ray.sh do not fit as they are.
#
# Usage, in the project's root:   bash scripts/gpu_uploads.sh DEST:FOLDER [DEST:FOLDER ...]
#   e.g. /tmp/stage:.gpu/c1 /tmp/stage:.gpu/c2 /tmp/stage:.gpu/c3 /tmp/stage:.gpu/c4 /tmp/stage-ray:.gpu/r1 ...
# Writes .gpu/u1 .. .gpu/uN (UPLOAD_MIB each at most, default 50): every file of every FOLDER, a file
# larger than that in pieces, and place.sh.  On the GPU host, one call per folder, in order:
#   bash .gpu/uK/place.sh        (copies its files to their DEST; a file's pieces are appended in order;
#                                 PLACE_ROOT=DIR places them under DIR instead, to check a cut here)
set -euo pipefail
limit=$(( ${UPLOAD_MIB:-50} * 1024 * 1024 ))
root=$(git rev-parse --show-toplevel)
out=$root/.gpu
rm -rf "$out"/u[0-9]*
k=1; size=0
open_folder() { mkdir -p "$out/u$k"; printf 'set -e\nhere=$(dirname "$0"); root=${PLACE_ROOT:-}\n' > "$out/u$k/place.sh"; }
open_folder
for spec in "$@"; do
  dest=${spec%%:*}; src=${spec#*:}
  for f in "$src"/* ; do
    [ -f "$f" ] || continue
    name=$(basename "$f"); total=$(stat -c %s "$f"); offset=0; piece=0
    while (( offset < total || (total == 0 && piece == 0) )); do
      room=$(( limit - size ))
      if (( room <= 0 )); then k=$((k+1)); size=0; open_folder; room=$limit; fi
      n=$(( total - offset < room ? total - offset : room ))
      part="$name.piece_$piece"
      dd if="$f" of="$out/u$k/$part" bs=4M iflag=skip_bytes,count_bytes skip="$offset" count="$n" status=none
      op='>'; (( piece > 0 )) && op='>>'
      printf 'mkdir -p "$root"%q && cat "$here"/%q %s "$root"%q\n' "$dest" "$part" "$op" "$dest/$name" >> "$out/u$k/place.sh"
      offset=$(( offset + n )); size=$(( size + n )); piece=$((piece+1))
      (( total == 0 )) && break
    done
  done
done
du -sh "$out"/u[0-9]* | sed 's|'"$root"'/||'
