"""The ``rollout_buffer`` rollout: training groups from trajectories that agents wrote to
``rlsdk buffer serve`` (or slime's rollout buffer), tokenized with loss masks from their messages."""

from __future__ import annotations

import os
import time
from typing import Any

from rlsdk import RolloutFnTrainOutput, Sample
from rlsdk.buffer_service import TOKEN_ENV
from rlsdk.errors import RlsdkError
from rlsdk.runtime import get_runtime

from .sft import fill_from_messages

POLL_SECONDS = 0.5
LEASE_SECONDS = 60.0
"""Seconds the service waits for this rollout's acknowledgement of groups it handed out."""


class RolloutBufferError(RlsdkError, RuntimeError):
    """The buffer service refused, its task failed, or complete groups did not come in time: an error
    ``rlsdk run`` reports in one line."""


def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(url, json=body)
    if response.status_code >= 400:
        raise RolloutBufferError(f"rollout buffer {url} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def start_payload(args: Any) -> dict[str, Any]:
    """The ``/start_rollout`` body, with slime's field names."""
    return {
        "task_type": args.rollout_task_type,
        "input_file": args.prompt_data,
        "num_repeat_per_sample": args.n_samples_per_prompt,
        "remote_engine_url": f"http://{args.sglang_router_ip}:{args.sglang_router_port}" if args.sglang_router_port else None,
        "remote_buffer_url": args.rollout_buffer_url,
        "max_tokens": args.rollout_max_response_len,
        "sampling_params": {"max_tokens": args.rollout_max_response_len, "temperature": args.rollout_temperature,
                            "top_p": args.rollout_top_p},
        "tokenizer_path": args.hf_checkpoint or args.model,
    }


def item_to_sample(args: Any, tokenizer: Any, item: dict[str, Any], group_index: int, index: int) -> Sample:
    """One trajectory as a sample: tokens and loss mask from its messages, its reward and status."""
    extra = dict(item.get("extra_info") or {})
    sample = Sample(group_index=group_index, index=index, prompt=item["messages"], reward=item["reward"],
                    metadata={**extra, "instance_id": item["instance_id"], "uid": item.get("uid")})
    fill_from_messages(args, tokenizer, sample, item["messages"], extra.get("tools"))
    if extra.get("finish_reason") == "length":
        sample.status = Sample.Status.TRUNCATED
    return sample


def rollout_buffer(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
    """Collect ``rollout_batch_size`` complete groups from the buffer service at ``args.rollout_buffer_url``,
    starting ``args.rollout_task_type`` there (a task already running is not started again). Groups are
    asked for no more than are needed and acknowledged once received, so none waits in this process's
    memory: the others stay in the service, on disk."""
    import httpx

    if evaluation:
        raise ValueError("the rollout_buffer rollout has no eval mode: set --eval-function-path to an eval rollout")
    if not args.rollout_buffer_url:
        raise ValueError("the rollout_buffer rollout needs --rollout-buffer-url (the address of `rlsdk buffer serve`)")
    runtime = get_runtime(args)
    if runtime.tokenizer is None:
        raise RuntimeError("the rollout_buffer rollout needs the run's tokenizer (its chat template)")
    state = runtime.state.setdefault("rollout_buffer", {"started": False})
    base = args.rollout_buffer_url.rstrip("/")
    token = os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    groups: list[list[dict[str, Any]]] = []
    with httpx.Client(timeout=60, headers=headers) as client:
        if not state["started"] and args.rollout_task_type:
            _post(client, base + "/start_rollout", start_payload(args))
        state["started"] = True
        deadline = time.monotonic() + args.rollout_buffer_wait
        while len(groups) < args.rollout_batch_size:
            wanted = {"max_groups": args.rollout_batch_size - len(groups), "lease_seconds": LEASE_SECONDS}
            answer = _post(client, base + "/get_rollout_data", wanted)
            data = answer.get("data") or {}
            if data.get("meta_info", {}).get("task_errors"):
                raise RolloutBufferError(f"rollout buffer task failed: {data['meta_info']['task_errors'][-1]}")
            lease_id = data.get("meta_info", {}).get("lease_id")
            if answer.get("success") and lease_id:
                if client.post(base + "/ack_rollout_data", json={"lease_id": lease_id}).status_code == 200:
                    by_instance: dict[str, list[dict[str, Any]]] = {}
                    for item in data.get("data", []):
                        by_instance.setdefault(str(item["instance_id"]), []).append(item)
                    groups.extend(by_instance.values())
                continue  # an acknowledgement that came too late: the groups will be served again
            if time.monotonic() > deadline:
                raise RolloutBufferError(
                    f"rollout buffer {base}: {len(groups)} of {args.rollout_batch_size} complete groups "
                    f"after {args.rollout_buffer_wait:g}s (--rollout-buffer-wait); are agents writing to it?"
                )
            time.sleep(POLL_SECONDS)
    samples = []
    for g, group in enumerate(groups):
        base_index = rollout_id * args.rollout_batch_size + g
        samples.append([item_to_sample(args, runtime.tokenizer, item, base_index, base_index * len(group) + i)
                        for i, item in enumerate(group)])
    metrics = {"rollout/buffer/groups": len(groups), "rollout/buffer/samples": sum(len(g) for g in samples)}
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)
