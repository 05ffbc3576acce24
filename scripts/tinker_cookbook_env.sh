#!/usr/bin/env bash
# The tinker-cookbook's own environment (its pins differ from rlsdk's): tinker-cookbook 0.6.1 and the pinned
# tinker client, in $1 (default .venv-cookbook). The cookbook asks for tml-renderers>=0.4.1, which is not on
# PyPI (0.2.1 is the newest there); it imports it only for Thinking Machines' own models, so the cookbook is
# installed without it and its other requirements are installed as it lists them (with its math-rl extra,
# which its RL loop's grader needs).
#
#   bash scripts/tinker_cookbook_env.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-cookbook}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip "$@"; }
pip install -q torch==2.13.0
pip install -q --no-deps tinker-cookbook==0.6.1
pip install -q tinker==0.38.0 "aiohttp>=3.9.0" "anyio>=4.0.0" "blobfile>=3.0.0" "chz>=0.4.0" "cloudpickle>=3.0.0" \
    "datasets>=2.14.0" "huggingface-hub>=0.20.0" "numpy>=1.24.0" "pillow>=10.0.0" "pydantic>=2.0.0" \
    "pyrage>=1.4.0" "rich>=13.0.0" "safetensors>=0.4.0" "termcolor>=2.0.0" "tiktoken>=0.12.0" "tqdm>=4.60.0" \
    "transformers!=5.3.0,!=5.4.*,!=5.5.0,!=5.5.1,!=5.5.2,!=5.5.3,!=5.6.*,>=4.57.6" \
    "math-verify>=0.5.0" "pylatexenc>=2.0" "sympy>=1.12.0"
"$venv/bin/python" -c "import tinker_cookbook.recipes.sl_loop, tinker_cookbook.recipes.rl_loop, tinker; print('tinker-cookbook', tinker_cookbook.__version__ if hasattr(tinker_cookbook, '__version__') else '0.6.1', 'tinker', tinker.__version__)"
