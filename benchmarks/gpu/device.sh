#!/usr/bin/env bash
# The GPU machine's side of the benchmarks (not part of CI). Run from the repository root there, with
# the carry folder (default .gpu/, filled by prepare.sh and build_sglang_archive.sh) beside it:
#
#   bash benchmarks/gpu/device.sh piece      # copy the carried SGLang piece(s) to /tmp/chunks (one call each, about 8 s
#                                            # of device time with the transfer on an H200, 2026-11-29)
#   bash benchmarks/gpu/device.sh setup      # reassemble SGLang into /tmp/site; rlsdk into /tmp/rl
#   bash benchmarks/gpu/device.sh embedded   # engine_gpu.py (8 rounds, about 7.5-8.5 minutes: a call of its own)
#   bash benchmarks/gpu/device.sh generate   # embedded_vs_generate.py
#   bash benchmarks/gpu/device.sh server     # start SGLang 0.5.17 on the bench model, random weights
#   bash benchmarks/gpu/device.sh sglang     # wait for it; sglang_checks.py and sglang_throughput.py
#   bash benchmarks/gpu/device.sh launch     # gpu_loop.py throughput: hand-started vs rlsdk-launched SGLang (~7 min)
#   bash benchmarks/gpu/device.sh colocate   # gpu_loop.py colocate: train step, CUDA-IPC sync, trust check (~4 min)
#   bash benchmarks/gpu/device.sh nccl       # gpu_loop.py nccl: the same through an NCCL broadcast (two GPUs)
#   bash benchmarks/gpu/device.sh engines2   # gpu_loop.py engines2: one launched engine vs two behind the router
#   bash benchmarks/gpu/device.sh engines4   # the same with four engines (four GPUs; 5 passes each, best and median)
#   bash benchmarks/gpu/device.sh megatron   # megatron_parity.py: megatron vs torch trainer (~2 min)
#   bash benchmarks/gpu/device.sh megatron_parallel  # megatron_parallel.py: TP=2, DP=2 and PP=2 vs one GPU (two GPUs;
#     MEGATRON_PARALLEL_ARGS="--shape qwen3-moe-32e --steps 5": EP=2, DP=2, PP=2 and TP=2 of a 32-expert MoE, ~7 min on
#     2x H100 before PP=2 was added (not re-measured); "--configs pp2 --steps 5": PP=2 alone vs one GPU)
#   bash benchmarks/gpu/device.sh model      # reassemble the carried SmolLM2 GGUF, convert it to /tmp/rlsdk-models
#   bash benchmarks/gpu/device.sh learn      # learning_gpu.py: GRPO on SmolLM2 through colocated SGLang (80 steps: 7.7 min
#                                            # on an H200, 2026-11-29)
#   bash benchmarks/gpu/device.sh lora       # sglang_lora.py: SGLang --enable-lora on SmolLM2 (after `model`): the LoRA
#                                            # protocol's answers, an adapter's log-probs, the demo trained with
#                                            # --lora-rank 16, the trained adapter applied or not (4 min on an H200)
#   bash benchmarks/gpu/device.sh trust      # trust_gpu.py (after `model`): checksums against SGLang's, one tensor
#                                            # sent stale or not sent at each position, correct syncs (`piece setup
#                                            # model trust` in one call: 4.6 min on an H200 with one fault kind;
#                                            # TRUST_ARGS="--faults stale" for one kind, more in trust_gpu.py)
#   bash benchmarks/gpu/device.sh tinker     # tinker_gpu.py (after setup and model): rlsdk tinker serve on CUDA with
#                                            # SmolLM2; tinker-cookbook's rl_loop learning single-digit addition, its
#                                            # sampler-vs-trainer check, forward_backward overhead at 8k tokens (~8 min;
#                                            # TINKER_ARGS="--parts rl" or "--parts numerics,overhead" to split it)
#   bash benchmarks/gpu/device.sh determinism  # learning_gpu.py twice with --deterministic (after setup and model; 20
#                                            # steps each, DET_STEPS; DET_RUNS=a, then b, to split the runs over
#                                            # calls; "default" adds a run without the flag): SGLang launched with
#                                            # --enable-deterministic-inference; determinism_gpu.json compares the
#                                            # two runs' reward curves and metrics.jsonl, the first line that differs
#   bash benchmarks/gpu/device.sh learn_megatron  # the same with --trainer megatron (~9 min)
#     (LEARN_ARGS="--ray": the engine and the trainer as Ray actors, a GPU each; two GPUs;
#      LEARN_KILL_AFTER=S: SIGKILL the SGLang server S seconds after the run starts, once)
#   bash benchmarks/gpu/device.sh learn_sync_ray   # learning_gpu.py --ray: engine and trainer a GPU each (two GPUs, ~9 min)
#   bash benchmarks/gpu/device.sh learn_async_ray  # the same with --async (one call each; LEARN_MINUTES=8)
#   bash benchmarks/gpu/device.sh learn_lag2_ray   # --max-policy-version-lag 2, longer responses (LAG_RESPONSE_LEN=512)
#   bash benchmarks/gpu/device.sh learn_sync_long_ray  # the synchronous baseline of that workload
#   bash benchmarks/gpu/device.sh learn_async_long_ray # --async on that workload
#     then, anywhere: python benchmarks/gpu/async_compare.py $OUT/learning_gpu_{sync,async}.json ... (plot + JSON)
#   bash benchmarks/gpu/device.sh ray_engines     # ray_engines.py: 2 SGLang engine actors on Ray, one SIGKILLed (two GPUs)
#     (RAY_ENGINES_ARGS="--engines 1 --spares 1": one serving engine and a started spare)
#   bash benchmarks/gpu/device.sh ray_startup     # faults.py --tiny --startup-only: what Ray's start adds on this many cores
#   bash benchmarks/gpu/device.sh setup_vllm # reassemble vLLM 0.26 (vllm-wheels.tar.part-*) into /tmp/vllm-site; /tmp/vllm-python
#   bash benchmarks/gpu/device.sh vllm       # vllm_checks.py: capture vLLM's answers into $OUT/vllm-fixtures (copy them over
#                                            # tests/fixtures/vllm-0.26.0-*.json) and run the engine contract on a real vLLM
#   bash benchmarks/gpu/device.sh vllm_throughput  # vllm_throughput.py: tokens/s of vLLM vs SGLang, same workload, same call
#   bash benchmarks/gpu/device.sh vllm_colocate    # gpu_loop.py colocate --engine vllm (sync s, trust-check gaps, weights
#                                            # check); `colocate` gives SGLang's in a call of its own on the same machine
#   bash benchmarks/gpu/device.sh vllm_nccl  # gpu_loop.py nccl --engine vllm (two GPUs)
#   bash benchmarks/gpu/device.sh learn_vllm # learning_gpu.py --engine vllm (after `model`; LEARN_MINUTES=8 as `learn`)
#   bash benchmarks/gpu/device.sh slime_examples  # scripts/slime_examples.py --gpu (after setup and model): slime's
#                                            # examples (carried as slime-examples.tar, prepare.sh with SLIME_GIT_DIR)
#                                            # from their launch scripts on rlsdk-launched SGLang and SmolLM2 (not run
#                                            # yet; one JSON line per example in $OUT/slime_examples.jsonl)
#   bash benchmarks/gpu/device.sh scale      # scale.py: Qwen3-4B shape, megatron + SGLang colocated with offload (~5.5 min
#     on an H100, 2026-11-28: the 8 GB checkpoint ~1 min, SGLang and trainer start ~2.3 min, 4 steps ~2 min)
#     (SCALE_ARGS: more of its options)
#   bash benchmarks/gpu/device.sh scale8b_split  # four GPUs: Qwen3-8B shape, megatron TP=2 on two, two SGLang engines
#                                                # behind the router on the other two, NCCL sync (not yet run)
#   bash benchmarks/gpu/device.sh megatron_moe4  # four GPUs: scaled-down Qwen3-MoE, EP=2 and EP=4 vs one GPU (not yet run)
#
# Carry only what a phase needs: SGLang's pieces (sglang-wheels.tar.part-*) for every phase that starts
# SGLang; vLLM's (vllm-wheels.tar.part-*, benchmarks/gpu/build_vllm_archive.sh) for the vllm phases; Ray and
# sglang-router (extra-wheels.tar.part-*) only for engines2, engines4, scale8b_split, ray_engines, ray_startup and
# learn with LEARN_ARGS="--ray"; the GGUF (gguf.part-*) only for model, learn and learn_megatron. setup
# unpacks whatever was carried.
#
# Several phases may be given in one call. Results (one JSON file per script, its log) go to $OUT
# (default /tmp/gpu-results). GPU_DIR overrides the carry folder.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
gpu=$(cd "${GPU_DIR:-.gpu}" && pwd)
out=${OUT:-/tmp/gpu-results}
chunks=/tmp/chunks site=/tmp/site rl=/tmp/rl vsite=/tmp/vllm-site port=${SGLANG_PORT:-30000}
url=http://127.0.0.1:$port
mkdir -p "$out"

sglang_env() { PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages "$@"; }
rlsdk_env() { PYTHONPATH=$rl:$here${path_tail:+:$path_tail} "$@"; }  # path_tail: last on the path

bench() {  # bench NAME SCRIPT ARGS...: the log to $OUT/NAME.log, its last JSON line to $OUT/NAME.json
  local name=$1; shift
  echo "== $name"
  rlsdk_env python3 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  # By pattern, not the last line: NCCL or an exiting library may print after the report (the megatron
  # phase's last line was once an NCCL warning, leaving its result file without JSON).
  grep '^{"benchmark"' "$out/$name.log" | tail -n 1 >"$out/$name.json"
  echo "$name exited $rc: $(head -c 600 "$out/$name.json")"
}

piece() {  # whichever pieces this call carried: SGLang's archive, the extra wheels (Ray, sglang-router), the GGUF
  mkdir -p "$chunks"
  local carried=("$gpu"/sglang-wheels.tar.part-* "$gpu"/sglang-site.tar.xz.part-* "$gpu"/extra-wheels.tar.part-*
                 "$gpu"/gguf.part-* "$gpu"/vllm-wheels.tar.part-*)
  for file in "${carried[@]}"; do [ -f "$file" ] && cp "$file" "$chunks"/; done
  [ -d "$gpu/tinker-wheels" ] && cp -r "$gpu/tinker-wheels" "$chunks"/  # the tinker phase's (prepare.sh)
  ls "$chunks" | tr '\n' ' ' && echo
}

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$rl" "$gpu"/rlsdk-wheels/*.whl || return 1
  rm -rf /tmp/sglang-wheels "$site" && mkdir -p /tmp/sglang-wheels "$site"
  if ls "$chunks"/sglang-site.tar.xz.part-* >/dev/null 2>&1; then  # SGLang's wheels already unpacked, xz'd
    cat "$chunks"/sglang-site.tar.xz.part-* | tar xJf - -C "$site" || return 1
  else
    cat "$chunks"/sglang-wheels.tar.part-* | tar xf - -C /tmp/sglang-wheels || return 1
  fi
  if ls "$chunks"/extra-wheels.tar.part-* >/dev/null 2>&1; then  # Ray and sglang-router, where carried
    cat "$chunks"/extra-wheels.tar.part-* | tar xf - -C /tmp/sglang-wheels || return 1
  fi
  echo "wheels: $(ls /tmp/sglang-wheels | wc -l)"
  # A wheel is a zip laid out as site-packages (none of these has .data/purelib or platlib): unzip them
  # all in parallel, as pip install --target would place them.
  python3 "$here/unpack_wheels.py" /tmp/sglang-wheels "$site" || return 1
  # The interpreter rlsdk's launcher runs SGLang with: SGLang's folder first on its path, and only there.
  printf '#!/bin/sh\nPYTHONPATH=%s:%s/nvidia_cutlass_dsl/dsl_packages exec python3 "$@"\n' "$site" "$site" \
      >/tmp/sglang-python && chmod +x /tmp/sglang-python
  sglang_env python3 -c "import sglang, sgl_kernel, flashinfer, transformers; print('sglang', sglang.__version__, 'transformers', transformers.__version__)"
}

setup_vllm() {  # vLLM's wheels unpacked into a folder of its own; /tmp/vllm-python runs with it first on the path
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$rl" "$gpu"/rlsdk-wheels/*.whl || return 1
  rm -rf /tmp/vllm-wheels "$vsite" && mkdir -p /tmp/vllm-wheels "$vsite"
  cat "$chunks"/vllm-wheels.tar.part-* | tar xf - -C /tmp/vllm-wheels || return 1
  echo "vllm wheels: $(ls /tmp/vllm-wheels | wc -l)"
  python3 "$here/unpack_wheels.py" /tmp/vllm-wheels "$vsite" || return 1
  # rlsdk's launcher adds its worker extension's folder to PYTHONPATH: the wrapper keeps what it is given
  printf '#!/bin/sh\nPYTHONPATH=%s:%s/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' \
      "$vsite" "$vsite" >/tmp/vllm-python && chmod +x /tmp/vllm-python
  /tmp/vllm-python -c "import vllm, flashinfer, transformers, torch; print('vllm', vllm.__version__, 'flashinfer', flashinfer.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
  /tmp/vllm-python -c "import vllm.entrypoints.openai.api_server" && echo "vllm api_server imports"
}

vllm() {  # the real answers into $OUT/vllm-fixtures, and the engine contract on a real vLLM
  rm -rf "$out/vllm-fixtures"
  bench vllm_checks "$here/vllm_checks.py" --model-config "$gpu/bench-model" --vllm-python /tmp/vllm-python \
      --output "$out/vllm-fixtures"
  tail -n 200 /tmp/vllm-checks-*/run/logs/vllm-server-0.log >"$out/vllm_checks-server.log" 2>/dev/null
  return 0
}

vllm_throughput() {
  bench vllm_throughput "$here/vllm_throughput.py" --model-config "$gpu/bench-model" \
      --sglang-python /tmp/sglang-python --vllm-python /tmp/vllm-python --repeat 2
}

vllm_colocate() {  # the colocate steps on vLLM; `colocate` (SGLang) in the call before or after, on the same machine
  bench gpu_loop_colocate_vllm "$here/gpu_loop.py" colocate --engine vllm --model-config "$gpu/bench-model" \
      --vllm-python /tmp/vllm-python
  for server_log in /tmp/gpu-loop-*/logs/vllm-server-0.log; do
    [ -f "$server_log" ] && tail -n 150 "$server_log" >"$out/gpu_loop_colocate_vllm-server.log"
  done
  return 0
}

vllm_nccl() {
  bench gpu_loop_nccl_vllm "$here/gpu_loop.py" nccl --engine vllm --model-config "$gpu/bench-model" \
      --vllm-python /tmp/vllm-python
}

learn_vllm() {  # learning_gpu.py with the vllm engine, colocated: compare with `learn` (SGLang) on the same machine
  rm -rf /tmp/learn-vllm
  bench learning_gpu_vllm "$here/learning_gpu.py" --engine vllm --trainer torch --gguf "$gguf" --cache-dir "$models" \
      --vllm-python /tmp/vllm-python --output /tmp/learn-vllm --minutes "${LEARN_MINUTES:-8}" ${LEARN_ARGS:-}
  cp /tmp/learn-vllm/metrics.jsonl "$out/learning_gpu_vllm-metrics.jsonl" 2>/dev/null
  cp /tmp/learn-vllm/eval.jsonl "$out/learning_gpu_vllm-eval.jsonl" 2>/dev/null
  for server_log in /tmp/learn-vllm/logs/*.log; do
    [ -f "$server_log" ] && gzip -c "$server_log" >"$out/learning_gpu_vllm-$(basename "$server_log").gz"
  done
  return 0
}

embedded() {
  bench engine_gpu "$here/../engine_gpu.py" --model-config "$gpu/bench-model"
}

generate() {
  bench embedded_vs_generate "$here/embedded_vs_generate.py" --model-config "$gpu/bench-model" --repeat 2
}

server() {
  cd /tmp && sglang_env setsid nohup python3 -m sglang.launch_server --model-path "$gpu/bench-model" \
      --load-format dummy --host 127.0.0.1 --port "$port" --tp 1 --mem-fraction-static 0.7 \
      >/tmp/sglang.log 2>&1 </dev/null &
  cd - >/dev/null
  echo "SGLang starting (log /tmp/sglang.log)"
}

wait_ready() {
  for _ in $(seq 1 400); do
    python3 -c "import urllib.request; urllib.request.urlopen('$url/health', timeout=2)" 2>/dev/null \
        && { echo "SGLang ready"; return 0; }
    pgrep -f sglang.launch_server >/dev/null || { echo "SGLang exited"; tail -n 40 /tmp/sglang.log; return 1; }
    sleep 1
  done
  echo "SGLang not ready"; tail -n 40 /tmp/sglang.log; return 1
}

sglang() {
  wait_ready || { cp /tmp/sglang.log "$out/"; return 1; }
  bench sglang_checks "$here/sglang_checks.py" --url "$url" --model-config "$gpu/bench-model"
  bench sglang_throughput "$here/sglang_throughput.py" --url "$url" --model-config "$gpu/bench-model" --repeat 2
  tail -n 200 /tmp/sglang.log >"$out/sglang.log"
}

launch() {
  bench gpu_loop_throughput "$here/gpu_loop.py" throughput --model-config "$gpu/bench-model" \
      --sglang-python /tmp/sglang-python --repeat 2
}

colocate() {
  bench gpu_loop_colocate "$here/gpu_loop.py" colocate --model-config "$gpu/bench-model" \
      --sglang-python /tmp/sglang-python
}

nccl() {
  bench gpu_loop_nccl "$here/gpu_loop.py" nccl --model-config "$gpu/bench-model" --sglang-python /tmp/sglang-python
}

engines_n() {  # engines_n N: one launched engine, then N behind the router, 5 passes each (ENGINES2_ARGS: more)
  # shellcheck disable=SC2086  # ENGINES2_ARGS is a list of options
  bench "gpu_loop_engines$1" "$here/gpu_loop.py" engines2 --engines "$1" --model-config "$gpu/bench-model" \
      --sglang-python /tmp/sglang-python --repeat 5 ${ENGINES2_ARGS:-}
  for router_log in /tmp/gpu-loop-*/logs-*/sglang-router.log; do
    [ -f "$router_log" ] && tail -n 150 "$router_log" >"$out/engines$1-$(basename "$(dirname "$router_log")")-router.log"
  done
  return 0
}
engines2() { engines_n 2; }
engines4() { engines_n 4; }

megatron() {
  bench megatron_parity "$here/megatron_parity.py" --model-config "$gpu/bench-model"
}

megatron_parallel() {
  # shellcheck disable=SC2086  # MEGATRON_PARALLEL_ARGS is a list of options
  bench megatron_parallel "$here/megatron_parallel.py" --model-config "$gpu/bench-model" ${MEGATRON_PARALLEL_ARGS:-}
  for rank_log in /tmp/megatron-parallel-*/out-*/logs/megatron-rank-*.log; do
    [ -f "$rank_log" ] && tail -n 100 "$rank_log" >"$out/megatron_parallel-$(basename "$(dirname "$(dirname "$rank_log")")")-$(basename "$rank_log")"
  done
  return 0
}

gguf=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf models=/tmp/rlsdk-models

model() {  # the GGUF's pieces (prepare.sh split it) back into one file, converted once as the embedded engine does
  mkdir -p /tmp/gguf && cat "$chunks"/gguf.part-* >"$gguf" || return 1
  rlsdk_env python3 -c "from pathlib import Path; from rlsdk_embedded.model_files import converted_gguf
print(converted_gguf(Path('$gguf'), '$models'))"
}

tinker() {  # tinker_gpu.py: the carried tinker wheels unpacked, then found after rlsdk and before SGLang's folder
  local wheels=$gpu/tinker-wheels
  [ -d "$wheels" ] || wheels=$chunks/tinker-wheels  # carried in an earlier call, kept by piece
  rm -rf /tmp/tinker-site && mkdir -p /tmp/tinker-site
  python3 "$here/unpack_wheels.py" "$wheels" /tmp/tinker-site || return 1
  local converted
  converted=$(ls -d "$models"/SmolLM2-135M-Instruct-* 2>/dev/null | head -n 1)
  [ -n "$converted" ] || { echo "no converted SmolLM2: run the model phase first"; return 1; }
  # shellcheck disable=SC2086  # TINKER_ARGS is a list of options
  path_tail=/tmp/tinker-site:$site bench tinker_gpu "$here/tinker_gpu.py" --model "$converted" ${TINKER_ARGS:-}
}

learn_with() {  # learn_with TRAINER: learning_gpu.py (LEARN_ARGS: more of its options); metrics and evals beside its JSON
  rm -rf "/tmp/learn-$1"
  local ray_site=""  # with --ray, Ray comes from SGLang's folder, after the image's packages
  case " ${LEARN_ARGS:-} " in *" --ray "*) ray_site=$site ;; esac
  if [ -n "${LEARN_KILL_AFTER:-}" ]; then
    (sleep "$LEARN_KILL_AFTER" && pkill -9 -f -o "sglang.launch_server" && echo "killed SGLang at ${LEARN_KILL_AFTER}s") &
  fi
  # shellcheck disable=SC2086  # LEARN_ARGS is a list of options
  path_tail=$ray_site bench "learning_gpu_$1" "$here/learning_gpu.py" --trainer "$1" --gguf "$gguf" --cache-dir "$models" \
      --sglang-python /tmp/sglang-python --output "/tmp/learn-$1" --minutes "${LEARN_MINUTES:-8}" ${LEARN_ARGS:-}
  cp "/tmp/learn-$1/metrics.jsonl" "$out/learning_gpu_$1-metrics.jsonl" 2>/dev/null
  cp "/tmp/learn-$1/eval.jsonl" "$out/learning_gpu_$1-eval.jsonl" 2>/dev/null
  cp "/tmp/learn-$1.log" "$out/learning_gpu_$1-run.log" 2>/dev/null
  for server_log in /tmp/learn-"$1"/logs/*.log; do
    [ -f "$server_log" ] && gzip -c "$server_log" >"$out/learning_gpu_$1-$(basename "$server_log").gz"
  done
  return 0
}

ray_engines() {  # Ray (and jsonschema) come from SGLang's folder, after the image's packages; RAY_ENGINES_ARGS: more options
  rm -rf /tmp/ray-engines
  # shellcheck disable=SC2086  # RAY_ENGINES_ARGS is a list of options
  path_tail=$site bench ray_engines "$here/ray_engines.py" --hf-checkpoint "$gpu/bench-model" \
      --sglang-python /tmp/sglang-python --output /tmp/ray-engines ${RAY_ENGINES_ARGS:-}
  for server_log in /tmp/ray-engines/logs/*.log; do  # each start's timeline, then the end
    [ -f "$server_log" ] && { grep -E "^\\$ |server_args=|Init torch|Load weight|KV Cache|Capture|max_total_num|fired up" \
        "$server_log" | cut -c1-300; tail -n 100 "$server_log"; } >"$out/ray_engines-$(basename "$server_log")"
  done
  return 0
}

ray_startup() {  # the CPU-side start-up comparison of benchmarks/faults.py, on this machine's cores
  path_tail=$site bench faults_startup "$here/../faults.py" --tiny --startup-only
}

lora() {  # its files in /tmp/sglang-lora; back in $OUT: the report, the protocol's answers, the run's rows
  local folder
  folder=$(rlsdk_env python3 -c "from pathlib import Path; from rlsdk_embedded.model_files import converted_gguf
print(converted_gguf(Path('$gguf'), '$models'))") || return 1
  rm -rf /tmp/sglang-lora
  bench sglang_lora "$here/sglang_lora.py" --model "$folder" --sglang-python /tmp/sglang-python --output /tmp/sglang-lora
  cp /tmp/sglang-lora/sglang-0.5.17-lora-responses.json "$out/" 2>/dev/null
  cp /tmp/sglang-lora/run/metrics.jsonl "$out/sglang_lora-metrics.jsonl" 2>/dev/null
  cp /tmp/sglang-lora/run/eval.jsonl "$out/sglang_lora-eval.jsonl" 2>/dev/null
  gzip -c /tmp/sglang-lora/run.log >"$out/sglang_lora-run.log.gz" 2>/dev/null
  return 0
}

trust() {  # trust_gpu.py (after `model`): checksums against SGLang's own, a tensor left out at each position
  rm -rf /tmp/trust
  # shellcheck disable=SC2086  # TRUST_ARGS is a list of options
  bench trust_gpu "$here/trust_gpu.py" --gguf "$gguf" --cache-dir "$models" --sglang-python /tmp/sglang-python \
      --output /tmp/trust ${TRUST_ARGS:-}
  cp /tmp/trust/sglang-0.5.17-checksums.json "$out/" 2>/dev/null
  return 0
}

learn_mode() {  # learn_mode NAME OPTIONS...: learning_gpu.py on Ray (two GPUs) as learning_gpu_NAME.json
  local name=$1; shift
  rm -rf "/tmp/learn-$name"
  path_tail=$site bench "learning_gpu_$name" "$here/learning_gpu.py" --trainer torch --ray --gguf "$gguf" \
      --cache-dir "$models" --sglang-python /tmp/sglang-python --output "/tmp/learn-$name" \
      --minutes "${LEARN_MINUTES:-8}" "$@"
  cp "/tmp/learn-$name/metrics.jsonl" "$out/learning_gpu_$name-metrics.jsonl" 2>/dev/null
  cp "/tmp/learn-$name/eval.jsonl" "$out/learning_gpu_$name-eval.jsonl" 2>/dev/null
  return 0
}
learn_sync_ray() { learn_mode sync; }
learn_async_ray() { learn_mode async --async; }
learn_sync_long_ray() { learn_mode sync_long --response-len "${LAG_RESPONSE_LEN:-512}"; }
learn_lag2_ray() { learn_mode lag2 --lag 2 --response-len "${LAG_RESPONSE_LEN:-512}"; }
learn_async_long_ray() { learn_mode async_long --async --response-len "${LAG_RESPONSE_LEN:-512}"; }

slime_examples() {  # slime's examples on SGLang (SLIME_EXAMPLES: which ones; default all)
  rm -rf /tmp/slime-files && mkdir -p /tmp/slime-files
  tar -x -C /tmp/slime-files -f "$gpu/slime-examples.tar" || return 1
  local converted
  converted=$(ls -d "$models"/SmolLM2-135M-Instruct-* 2>/dev/null | head -n 1)
  [ -n "$converted" ] || { echo "no converted SmolLM2: run the model phase first"; return 1; }
  # shellcheck disable=SC2086  # SLIME_EXAMPLES is a list of names
  rlsdk_env python3 "$here/../../scripts/slime_examples.py" /tmp/slime-files --gpu --sglang-python /tmp/sglang-python \
      --model "$converted" ${SLIME_EXAMPLES:+--examples $SLIME_EXAMPLES} >"$out/slime_examples.jsonl" 2>"$out/slime_examples.log"
  echo "slime_examples: $(cut -c1-200 "$out/slime_examples.jsonl")"
}

scale() {  # SCALE_ARGS: more of scale.py's options
  rm -rf /tmp/scale
  # shellcheck disable=SC2086  # SCALE_ARGS is a list of options
  bench scale "$here/scale.py" --tokenizer "$gpu/bench-model" --sglang-python /tmp/sglang-python \
      --output /tmp/scale ${SCALE_ARGS:-}
  for server_log in /tmp/scale/run/logs/*.log; do
    [ -f "$server_log" ] && tail -n 80 "$server_log" >"$out/scale-$(basename "$server_log")"
  done
  return 0
}

determinism() {  # --deterministic runs of learning_gpu.py (DET_RUNS, default "a b"; "default" runs without the
  # flag, for the mode's cost); once a and b both ran, determinism_gpu.json says what differs, if anything
  local run
  for run in ${DET_RUNS:-a b}; do
    rm -rf "/tmp/det-$run"
    bench "determinism_gpu_$run" "$here/learning_gpu.py" --trainer torch --gguf "$gguf" --cache-dir "$models" \
        --sglang-python /tmp/sglang-python --output "/tmp/det-$run" --steps "${DET_STEPS:-20}" --minutes 9.5 \
        --eval-interval 10 -- $([ "$run" = default ] || echo --deterministic)
    cp "/tmp/det-$run/metrics.jsonl" "$out/determinism_gpu_$run-metrics.jsonl" 2>/dev/null
    cp "/tmp/det-$run/determinism.json" "$out/determinism_gpu_$run-check.json" 2>/dev/null
  done
  [ -d /tmp/det-a ] && [ -d /tmp/det-b ] || return 0
  rlsdk_env python3 "$here/../determinism.py" --compare /tmp/det-a /tmp/det-b >"$out/determinism_gpu.json"
  tail -c 2000 "$out/determinism_gpu.json"
}

scale8b_split() {  # four GPUs: the Qwen3-8B shape trained with TP=2 on GPUs 0-1, two SGLang engines on 2-3, NCCL sync
  SCALE_ARGS="--shape qwen3-8b --tp 2 --gpus 2 --engine-gpus 2 ${SCALE_ARGS:-}" scale
}

megatron_moe4() {  # four GPUs: the scaled-down Qwen3-MoE (32 experts) at EP=2 and EP=4 against one GPU
  MEGATRON_PARALLEL_ARGS="--shape qwen3-moe-32e --configs ep2,ep4 ${MEGATRON_PARALLEL_ARGS:-}" megatron_parallel
}

learn() { learn_with torch; }
learn_megatron() { learn_with megatron; }

for phase in "$@"; do
  case $phase in
    piece|setup|setup_vllm|vllm|vllm_throughput|vllm_colocate|vllm_nccl|learn_vllm|embedded|generate|server|sglang|launch|colocate|nccl|engines2|engines4|megatron|megatron_parallel|model|learn|determinism|learn_megatron|lora|trust|tinker|ray_engines|ray_startup|learn_sync_ray|learn_async_ray|learn_sync_long_ray|learn_lag2_ray|learn_async_long_ray|slime_examples|scale|scale8b_split|megatron_moe4)
      echo "### $phase"; $phase || echo "### $phase failed" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
