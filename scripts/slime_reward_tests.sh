#!/bin/bash
# slime's own reward unit tests (tests/test_rm_*.py) against rlsdk_rm_hub.slime_rm_hub, with slime absent: its
# modules come from rlsdk's stand-ins (slime.rollout.rm_hub.* -> rlsdk_rm_hub.slime_rm_hub), run in a temporary
# copy outside this repository (slime's code is not ours to commit).
# Usage: scripts/slime_reward_tests.sh SLIME_GIT_DIR [PYTHON] [pytest args...]
#   SLIME_GIT_DIR: a clone (or bare mirror) of THUDM/slime; its HEAD is used (issue 52 used 624b824: 106 of 106).
set -euo pipefail
. "$(dirname "$0")/slime_copy.sh"
slime_work "$0" "$@"
tests=$(git -C "$slime" ls-tree --name-only HEAD tests/ | grep '^tests/test_rm_')
git -C "$slime" archive HEAD $tests | tar -x -C "$work"
printf 'from rlsdk.plugins.slime_layer import install\n\ninstall()\n' > "$work/conftest.py"
cd "$work"
"$python" -m pytest -p no:cacheprovider -p no:randomly -n 0 -q -rf tests "${rest[@]}"
