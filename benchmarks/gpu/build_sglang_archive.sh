#!/usr/bin/env bash
# Fetch SGLang 0.5.17's wheels for the GPU machine and cut them into pieces that fit one device call
# each. Runs on a CPU machine with PyPI access; not part of CI.
#
#   benchmarks/gpu/build_sglang_archive.sh [WHEEL_LIST] [OUT_DIR] [PIECE_SIZE]
#
# WHEEL_LIST: wheel file names, one a line (default: the shared sglang-0.5.17-wheels.txt, the 109 wheels
# SGLang needs on top of the GPU image's packages). OUT_DIR (default .gpu, ignored by git) receives
# wheels/ and sglang-wheels.tar split into PIECE_SIZE pieces (default 52M: a call carries at most
# 64 MiB, the checkout included, 7.3 MiB on 2026-11-29) named sglang-wheels.tar.part-NN. The wheels are already compressed;
# an uncompressed tar costs no CPU here and unpacks in seconds there (benchmarks/gpu/device.sh).
# SITE_XZ=1 also writes sglang-site.tar.xz.part-NN: the wheels unpacked as device.sh's setup would, xz'd
# (about half the size, 7 pieces instead of 12; but xz took about an hour on a busy 2-core machine, while a
# plain piece costs about 8 s of device time to carry: the plain pieces are the default and the cheaper way).
# Ray and sglang-router (for the two-GPU checks: engines behind the router, engines as Ray actors) go
# the same way into extra-wheels.tar.part-NN; their other needs are among SGLang's wheels or the image's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/shared_files.sh"
list=${1:-$(shared_file sglang-0.5.17-wheels.txt)}
list=$(realpath "$list" 2>/dev/null || echo "$list")
[ -f "$list" ] || { echo "no wheel list: pass the path of sglang-0.5.17-wheels.txt" >&2; exit 2; }
out=${2:-$root/.gpu}
piece=${3:-52M}
mkdir -p "$out/wheels"
# name==version from each file name (its first two dash-separated fields)
mapfile -t specs < <(sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' "$list")
gpu_wheels "$out/wheels" "${specs[@]}"
missing=$(comm -23 <(sort "$list") <(ls "$out/wheels" | sort))
[ -z "$missing" ] || { echo "not downloaded: $missing" >&2; exit 1; }
mapfile -t wheels < "$list"
tar_pieces "$out/wheels" "$out/sglang-wheels.tar" "$piece" "${wheels[@]}"
if [ -n "${SITE_XZ:-}" ]; then  # the same wheels unpacked and xz'd: 7 pieces instead of 12, fewer device calls
  stage=$(mktemp -d)
  python3 "$root/benchmarks/gpu/unpack_wheels.py" "$out/wheels" "$stage"
  rm -f "$out"/sglang-site.tar.xz.part-*
  tar cf - -C "$stage" . | xz -T0 -6 | split -b "$piece" -d -a 2 - "$out/sglang-site.tar.xz.part-"
  rm -rf "$stage"
  ls -l "$out"/sglang-site.tar.xz.part-*
fi
rm -rf "$out/extra-wheels" && mkdir -p "$out/extra-wheels"
gpu_wheels "$out/extra-wheels" ray==2.60.0 sglang-router==0.3.2
tar_pieces "$out/extra-wheels" "$out/extra-wheels.tar" "$piece"
