#!/bin/bash
# slime's own plugin contract tests (tests/plugin_contracts) pointed at rlsdk's plugins through the adapter
# (rlsdk.slime.<kind>.<name>), run in a temporary copy outside this repository (slime's code is not ours to
# commit). Usage: scripts/slime_contracts.sh SLIME_GIT_DIR [PYTHON] [pytest args...]
#   SLIME_GIT_DIR: a clone (or bare mirror) of THUDM/slime; its HEAD is used (issue 37 used 624b824).
set -euo pipefail
. "$(dirname "$0")/slime_copy.sh"
slime_work "$0" "$@"
git -C "$slime" archive HEAD slime tests/plugin_contracts | tar -x -C "$work"
cd "$work"
export SLIME_CONTRACT_ROLLOUT_FUNCTION_PATH=rlsdk.slime.generate_rollout.sglang
export SLIME_CONTRACT_EVAL_FUNCTION_PATH=rlsdk.slime.generate_rollout.sglang
export SLIME_CONTRACT_CUSTOM_GENERATE_FUNCTION_PATH=rlsdk.slime.custom_generate.single_turn
export SLIME_CONTRACT_CUSTOM_RM_PATH=rlsdk.slime.reward.math
export SLIME_CONTRACT_DYNAMIC_SAMPLING_FILTER_PATH=rlsdk.slime.dynamic_filter.check_reward_nonzero_std
export SLIME_CONTRACT_BUFFER_FILTER_PATH=rlsdk.slime.buffer_filter.pop_first
export SLIME_CONTRACT_DATA_SOURCE_PATH=rlsdk.slime.data_source.prompt_data
export SLIME_CONTRACT_CUSTOM_ROLLOUT_LOG_FUNCTION_PATH=rlsdk.slime.rollout_log.jsonl
export SLIME_CONTRACT_CUSTOM_EVAL_ROLLOUT_LOG_FUNCTION_PATH=rlsdk.slime.eval_rollout_log.jsonl
"$python" -m pytest -p no:cacheprovider -n 0 -q -rf tests/plugin_contracts "${rest[@]}"
