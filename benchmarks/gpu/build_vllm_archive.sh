#!/usr/bin/env bash
# Fetch vLLM 0.26.0's wheels for the GPU machine and cut them into pieces that fit one device call each, as
# build_sglang_archive.sh does for SGLang. Runs on a CPU machine with PyPI access; not part of CI.
#
#   benchmarks/gpu/build_vllm_archive.sh [OUT_DIR] [PIECE_SIZE]
#
# The wheels are those of benchmarks/gpu/vllm-0.26.0-wheels.txt (name==version, one a line: vLLM and what it
# needs beyond the GPU image's packages). OUT_DIR (default .gpu, ignored by git) receives vllm-wheels/ and
# vllm-wheels.tar split into PIECE_SIZE pieces (default 58M: a call carries at most 64 MiB, the checkout
# included) named vllm-wheels.tar.part-NN; `device.sh piece` carries whichever pieces are there and
# `device.sh setup_vllm` unpacks them into /tmp/vllm-site, beside SGLang's /tmp/site (vLLM's flashinfer 0.6.14
# and SGLang 0.5.17's 0.6.15 cannot share one folder).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
list="$root/benchmarks/gpu/vllm-0.26.0-wheels.txt"
out=${1:-$root/.gpu}
piece=${2:-58M}
mkdir -p "$out/vllm-wheels"
platforms=()
for n in 39 38 37 36 35 34 33 32 31 30 29 28 27 26 25 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform linux_x86_64 --platform any)
mapfile -t specs < <(grep -v '^#' "$list" | grep -v '^$')
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" -d "$out/vllm-wheels" "${specs[@]}"
count=$(ls "$out/vllm-wheels"/*.whl | wc -l)
[ "$count" -eq "${#specs[@]}" ] || { echo "downloaded $count wheels for ${#specs[@]} requirements" >&2; exit 1; }
rm -f "$out"/vllm-wheels.tar.part-*
(cd "$out/vllm-wheels" && tar cf - ./*.whl) | split -b "$piece" -d -a 2 - "$out/vllm-wheels.tar.part-"
du -sh "$out/vllm-wheels"
ls -l "$out"/vllm-wheels.tar.part-*
