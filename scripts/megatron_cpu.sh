#!/usr/bin/env bash
# megatron-core for the megatron plugin's CPU tests (gloo, float32) in this Python 3.11 environment, as CI
# runs them: megatron-core 0.19.2 ships only a cp312 wheel (for an optional C++ dataset helper these tests
# never load), so its files are unpacked into the environment's site-packages; triton is installed only
# because megatron's modules import it (no triton kernel runs on the CPU). Without this, those tests skip.
#
#   bash scripts/megatron_cpu.sh [VENV]      (default $VENV, else .venv)
set -euo pipefail
venv=${1:-${VENV:-.venv}}
if [ "$(uname -m)" != x86_64 ]; then
  echo "megatron_cpu.sh: megatron-core's wheel is for x86_64; the megatron tests will skip" >&2
  exit 0
fi
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
wheels=$(mktemp -d)
PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 -d "$wheels" \
    megatron-core==0.19.2
"$venv/bin/python" -m zipfile -e "$wheels"/megatron_core-0.19.2-*.whl "$site"
rm -rf "$wheels"
"$venv/bin/python" -m pip install -q --no-deps triton==3.9.0
"$venv/bin/python" -c "import megatron.core.models.gpt, megatron.core.pipeline_parallel; print('megatron-core', megatron.core.__version__)"
