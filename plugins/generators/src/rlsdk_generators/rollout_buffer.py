"""The ``rollout_buffer`` rollout: training groups from trajectories that agents wrote to
``rlsdk buffer serve`` (or slime's rollout buffer), tokenized with loss masks from their messages."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from rlsdk import BUFFER_TOKEN_ENV, RlsdkError, RolloutFnTrainOutput, Sample, get_runtime

from .sft import fill_from_messages

POLL_SECONDS = 0.5
LEASE_SECONDS = 60.0
"""Seconds the service waits for this rollout's acknowledgement of groups it handed out, when the rollout
acknowledges them on receipt (called outside ``rlsdk run``)."""
HELD_LEASE_SECONDS = 24 * 3600.0
"""Under ``rlsdk run`` groups stay leased until a saved run state covers their step (in a training run, the
next checkpoint): a trainer that died and never came back has them served again after this long; one that
restarts gives them back at once."""
LEASES_FILE = "rollout_buffer_leases.json"
"""In the run's output folder: the leases the run holds, by step, for a restarted run to settle."""


class RolloutBufferError(RlsdkError, RuntimeError):
    """The buffer service refused, its task failed, or complete groups did not come in time: an error
    ``rlsdk run`` reports in one line."""


class HeldLeases:
    """The leases of groups a run took and has not acknowledged, as ``[step, lease_id]`` pairs, also kept in
    :data:`LEASES_FILE`. :meth:`state_saved` (run by ``rlsdk run`` after each state it saves) acknowledges
    those whose step the state covers: only then are the groups the run's, in its outputs or checkpoint. A
    run that starts again acknowledges what its saved state covers and releases the rest, to be served
    again: a crash anywhere loses no group."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.path = Path(args.output_dir) / LEASES_FILE
        self.leases: list[list[Any]] = json.loads(self.path.read_text()) if self.path.exists() else []

    def add(self, rollout_id: int, lease_id: str) -> None:
        self.leases.append([rollout_id, lease_id])
        self._save()

    def settle_leftovers(self, saved_state: dict[str, Any] | None) -> None:
        """At the start of a run: the leases an earlier process of this output folder left (``saved_state``
        is the run state on disk: the steps it covers keep their leases)."""
        covered = saved_state["next_rollout_id"] if saved_state else 0
        release = [lease for lease in self.leases if lease[0] >= covered]
        self.leases = [lease for lease in self.leases if lease[0] < covered]
        with _client() as client:
            for _, lease_id in release:
                _post(client, self._url("/release_rollout_data"), {"lease_id": lease_id})
        self._save()
        self.state_saved({"next_rollout_id": covered})

    def state_saved(self, state: dict[str, Any]) -> None:
        """Acknowledge the leases of the steps before ``state["next_rollout_id"]``; one the service cannot
        take now is tried again at the next state saved."""
        import httpx

        held = []
        with _client() as client:
            for rollout_id, lease_id in self.leases:
                if rollout_id >= state["next_rollout_id"]:
                    held.append([rollout_id, lease_id])
                    continue
                try:
                    status = client.post(
                        self._url("/ack_rollout_data"), json={"lease_id": lease_id}
                    ).status_code
                except httpx.HTTPError:
                    status = None
                if status == 409:
                    warnings.warn(
                        f"rollout buffer: the lease of step {rollout_id}'s groups ended before the run's "
                        "state was saved; they will be served again",
                        stacklevel=2,
                    )
                elif status != 200:
                    held.append([rollout_id, lease_id])
        self.leases = held
        self._save()

    def _url(self, path: str) -> str:
        return self.args.rollout_buffer_url.rstrip("/") + path

    def _save(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.leases))
        os.replace(tmp, self.path)


def _client(timeout: float = 60.0) -> Any:
    import httpx

    token = os.environ.get(BUFFER_TOKEN_ENV)
    return httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {token}"} if token else {})


def _post(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(url, json=body)
    if response.status_code >= 400:
        raise RolloutBufferError(
            f"rollout buffer {url} answered {response.status_code}: {response.text[:300]}"
        )
    return response.json()


def start_payload(args: Any) -> dict[str, Any]:
    """The ``/start_rollout`` body, with slime's field names."""
    return {
        "task_type": args.rollout_task_type,
        "input_file": args.prompt_data,
        "num_repeat_per_sample": args.n_samples_per_prompt,
        "remote_engine_url": f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
        if args.sglang_router_port
        else None,
        "remote_buffer_url": args.rollout_buffer_url,
        "max_tokens": args.rollout_max_response_len,
        "sampling_params": {
            "max_tokens": args.rollout_max_response_len,
            "temperature": args.rollout_temperature,
            "top_p": args.rollout_top_p,
        },
        "tokenizer_path": args.hf_checkpoint or args.model,
    }


def item_to_sample(args: Any, tokenizer: Any, item: dict[str, Any], group_index: int, index: int) -> Sample:
    """One trajectory as a sample: tokens and loss mask from its messages, its reward and status."""
    extra = dict(item.get("extra_info") or {})
    sample = Sample(
        group_index=group_index,
        index=index,
        prompt=item["messages"],
        reward=item["reward"],
        metadata={**extra, "instance_id": item["instance_id"], "uid": item.get("uid")},
    )
    fill_from_messages(args, tokenizer, sample, item["messages"], extra.get("tools"))
    if extra.get("finish_reason") == "length":
        sample.status = Sample.Status.TRUNCATED
    return sample


def hold_leases(args: Any, runtime: Any) -> HeldLeases | None:
    """Under ``rlsdk run`` (which runs :attr:`rlsdk.Runtime.on_state_saved` callbacks): the run's held leases,
    those an earlier process left settled; elsewhere None (groups are acknowledged on receipt)."""
    if runtime.on_state_saved is None:
        return None
    held = HeldLeases(args)
    held.settle_leftovers(runtime.saved_state)
    runtime.on_state_saved.append(held.state_saved)
    return held


def rollout_buffer(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput:
    """Collect ``rollout_batch_size`` complete groups from the buffer service at ``args.rollout_buffer_url``,
    starting ``args.rollout_task_type`` there (a task already running is not started again). Groups are
    asked for no more than are needed, so none waits in this process's memory: the others stay in the
    service, on disk. Under ``rlsdk run`` they are acknowledged once a saved run state covers this step
    (see :class:`HeldLeases`), elsewhere as soon as they are received."""
    if evaluation:
        raise ValueError(
            "the rollout_buffer rollout has no eval mode: set --eval-function-path to an eval rollout"
        )
    if not args.rollout_buffer_url:
        raise ValueError(
            "the rollout_buffer rollout needs --rollout-buffer-url (the address of `rlsdk buffer serve`)"
        )
    import httpx

    runtime = get_runtime(args)
    if runtime.tokenizer is None:
        raise RuntimeError("the rollout_buffer rollout needs the run's tokenizer (its chat template)")
    state = runtime.state.setdefault("rollout_buffer", {"started": False, "held": None})
    base = args.rollout_buffer_url.rstrip("/")
    groups: list[list[dict[str, Any]]] = []
    silent: tuple[float, str] | None = None  # since when the service has not answered, and how
    with _client(min(60.0, args.rollout_buffer_wait)) as client:  # a call ends within the wait
        if not state["started"]:
            state["held"] = hold_leases(args, runtime)
            if args.rollout_task_type:
                _post(client, base + "/start_rollout", start_payload(args))
        state["started"] = True
        held: HeldLeases | None = state["held"]
        deadline = time.monotonic() + args.rollout_buffer_wait
        while len(groups) < args.rollout_batch_size:
            wanted = {
                "max_groups": args.rollout_batch_size - len(groups),
                "lease_seconds": LEASE_SECONDS if held is None else HELD_LEASE_SECONDS,
            }
            try:
                answer = _post(client, base + "/get_rollout_data", wanted)
                silent = None
            except httpx.TransportError as exc:  # gone or hung: it may come back within the wait
                silent = (silent[0] if silent else time.monotonic(), f"{type(exc).__name__}: {exc}")
                answer = {}
            data = answer.get("data") or {}
            if data.get("meta_info", {}).get("task_errors"):
                raise RolloutBufferError(
                    f"rollout buffer task failed: {data['meta_info']['task_errors'][-1]}"
                )
            lease_id = data.get("meta_info", {}).get("lease_id")
            if answer.get("success") and lease_id:
                if held is not None:
                    held.add(rollout_id, lease_id)  # acknowledged once a saved run state covers this step
                elif client.post(base + "/ack_rollout_data", json={"lease_id": lease_id}).status_code != 200:
                    continue  # an acknowledgement that came too late: the groups will be served again
                by_instance: dict[str, list[dict[str, Any]]] = {}
                for item in data.get("data", []):
                    by_instance.setdefault(str(item["instance_id"]), []).append(item)
                groups.extend(by_instance.values())
                continue
            if time.monotonic() > deadline:
                why = (
                    "are agents writing to it?"
                    if silent is None
                    else f"the service has not answered for {time.monotonic() - silent[0]:.1f}s ({silent[1]}): "
                    "is `rlsdk buffer serve` running? The groups this run took stay leased to it and are "
                    f"served again on --resume (rlsdk run --resume --output {args.output_dir})"
                )
                raise RolloutBufferError(
                    f"rollout buffer {base}: {len(groups)} of {args.rollout_batch_size} complete groups "
                    f"after {args.rollout_buffer_wait:g}s (--rollout-buffer-wait); {why}"
                )
            time.sleep(POLL_SECONDS)
    samples = []
    for g, group in enumerate(groups):
        base_index = rollout_id * args.rollout_batch_size + g
        samples.append(
            [
                item_to_sample(args, runtime.tokenizer, item, base_index, base_index * len(group) + i)
                for i, item in enumerate(group)
            ]
        )
    return RolloutFnTrainOutput(samples=samples, metrics=buffer_metrics(samples))


def buffer_metrics(groups: list[list[Sample]]) -> dict[str, Any]:
    """The step's metrics: every sample the service handed over is kept (the service's own filters ran
    there), so the ledger and the kept samples' mean scalar reward are what the step table shows."""
    count = sum(len(g) for g in groups)
    rewards = [float(s.reward) for g in groups for s in g if isinstance(s.reward, (int, float))]
    return {
        "rollout/buffer/groups": len(groups),
        "rollout/buffer/samples": count,
        "ledger/entered": count,
        "ledger/kept": count,
        "ledger/dropped": 0,
        "ledger/returned": 0,
        "ledger/failed": 0,
        "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else None,
    }
