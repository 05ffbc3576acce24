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
. "$(dirname "$0")/shared_files.sh"
list="$root/benchmarks/gpu/vllm-0.26.0-wheels.txt"
out=${1:-$root/.gpu}
piece=${2:-58M}
mkdir -p "$out/vllm-wheels"
mapfile -t specs < <(grep -v '^#' "$list" | grep -v '^$')
gpu_wheels "$out/vllm-wheels" "${specs[@]}"
count=$(ls "$out/vllm-wheels"/*.whl | wc -l)
[ "$count" -eq "${#specs[@]}" ] || { echo "downloaded $count wheels for ${#specs[@]} requirements" >&2; exit 1; }
du -sh "$out/vllm-wheels"
tar_pieces "$out/vllm-wheels" "$out/vllm-wheels.tar" "$piece"
