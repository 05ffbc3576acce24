"""A pytest plugin for plugin authors: an isolated plugin manager and contract checks per kind.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["rlsdk.testing"]``, then::

    def test_my_reward(rlsdk_pm):
        rlsdk_pm.register(my_plugin_module)
        check_reward(rlsdk_pm, "my_reward")

The checks, :class:`FakeEngine` and :class:`ByteTokenizer` import without pytest; the fixtures live in
:mod:`rlsdk.testing_fixtures`, which pytest loads along with this module.
"""

from __future__ import annotations

import asyncio
import collections
import random
import tempfile
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .agents import FunctionCall, ParsedTurn
from .config import RolloutConfig
from .engines import protocol
from .engines.engine import InferenceEngine
from .plugins.calls import (
    call_buffer_filter,
    call_dynamic_filter,
    call_over_sampling_filter,
    call_plugin,
    call_reward,
    run_to_completion,
)
from .plugins.manager import RlsdkPluginManager
from .plugins.records import Resolved
from .plugins.run_plugins import RunPlugins
from .rollout.buffer_service import BufferService, TrajectoryStore, start_buffer_server
from .rollout.generate import sampling_params_for
from .rollout.rewarding import score_group
from .run.engine_server import start_server
from .runtime import BackgroundLoop, Runtime, bind_runtime
from .testing_engine import (
    ENGINE_CONTRACT,
    EngineKit,
    check_engine_contract,
    process_alive,
    processes_gone,
    ray_test_cluster,
    tiny_llama,
)
from .testing_kinds import (
    check_advantage,
    check_all_samples_process,
    check_agent,
    check_checkpoint_callback,
    check_convert_samples_to_train_data,
    check_data_source,
    check_engine,
    check_environment,
    check_eval_rollout_log,
    check_generate_rollout,
    check_megatron_before_log_prob,
    check_megatron_before_train_step,
    check_megatron_init,
    check_model_provider,
    check_pg_loss_reducer,
    check_reward_post_process,
    check_rollout_data_postprocess,
    check_rollout_log,
    check_rollout_metrics,
    check_rollout_sample_filter,
    check_sample_hook,
    check_tis_function,
    check_tool,
    check_update_weight_post_write,
)
from .training.trainer import build_trainer
from .types import DynamicFilterOutput, Sample

pytest_plugins = ["rlsdk.testing_fixtures"]

__all__ = [
    "ENGINE_CONTRACT",
    "bind_runtime",
    "check_plugin",
    "sampling_params_for",
    "score",
    "scored",
    "tiny_llama",
    "tool_definition",
    "ByteTokenizer",
    "ChatTokenizer",
    "EngineKit",
    "FakeEngine",
    "FakeReply",
    "ServedBuffer",
    "ServedEngine",
    "check_advantage",
    "check_all_samples_process",
    "check_agent",
    "check_buffer_filter",
    "check_callable",
    "check_checkpoint_callback",
    "check_convert_samples_to_train_data",
    "check_custom_generate",
    "check_data_source",
    "check_dynamic_filter",
    "check_engine",
    "check_engine_contract",
    "check_environment",
    "check_eval_rollout_log",
    "check_generate_rollout",
    "check_loss",
    "check_megatron_before_log_prob",
    "check_megatron_before_train_step",
    "check_megatron_init",
    "check_model_provider",
    "check_over_sampling_filter",
    "check_pg_loss_reducer",
    "check_reward",
    "check_reward_post_process",
    "check_rollout_data_postprocess",
    "check_rollout_log",
    "check_rollout_metrics",
    "check_rollout_sample_filter",
    "check_sample_hook",
    "check_task_generator",
    "check_tis_function",
    "check_tool",
    "check_tool_call_parser",
    "check_trainer",
    "check_update_weight_post_write",
    "make_group",
    "make_train_groups",
    "process_alive",
    "processes_gone",
    "ray_test_cluster",
]


class ByteTokenizer:
    """Token ids are UTF-8 bytes: enough for prompts and responses in tests and benchmarks where a real
    tokenizer would only add cost and noise (``tokenizer(text)["input_ids"]``, ``decode``)."""

    def __call__(self, text: str | list[str], add_special_tokens: bool = False) -> dict[str, Any]:
        if isinstance(text, list):
            return {"input_ids": [list(t.encode()) for t in text]}
        return {"input_ids": list(text.encode())}

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


class ChatTokenizer(ByteTokenizer):
    """:class:`ByteTokenizer` with a ChatML chat template (``<|im_start|>role\ncontent<|im_end|>\n`` per
    message, ``<|im_start|>assistant\n`` to generate), rendered in Python without jinja: the tokenizer a
    :class:`FakeEngine` needs to answer ``/v1/chat/completions`` and ``/v1/messages``, so an agent on either
    client runs in a test (:func:`check_agent`). Tools are described by the tool-call parser in the system
    message, and tool calls written into the assistant's content, as for any template that renders neither.
    A reply ending with :attr:`eos_token` ends the turn."""

    eos_token = "<|im_end|>"
    chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    """What :meth:`apply_chat_template` renders, written as the jinja template it stands for."""

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The conversation as :attr:`chat_template` renders it (ids where ``tokenize``)."""
        text = "".join(
            f"<|im_start|>{m['role']}\n{self._content(m.get('content'))}{self.eos_token}\n" for m in messages
        )
        text += "<|im_start|>assistant\n" if add_generation_prompt else ""
        return self(text)["input_ids"] if tokenize else text

    @staticmethod
    def _content(content: Any) -> str:
        """A message's text: a string, or the text of its parts."""
        if isinstance(content, list):
            return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        return "" if content is None else str(content)


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


def make_train_groups(
    groups: int = 2,
    size: int = 2,
    *,
    length: int = 4,
    response_length: int = 2,
    vocab: int = 32,
    seed: int = 0,
) -> list[list[Sample]]:
    """``groups`` completed groups of ``size`` samples, ready for a trainer's step: each sample ``length``
    random token ids below ``vocab`` (drawn from ``seed``), the last ``response_length`` of them its response,
    each with the engine's log-prob -1.0; rewards 0.0, 1.0, 0.0, ... within a group."""
    rng = random.Random(seed)
    return [
        [
            Sample(
                group_index=g,
                index=g * size + i,
                tokens=[rng.randrange(vocab) for _ in range(length)],
                response_length=response_length,
                reward=float(i % 2),
                rollout_log_probs=[-1.0] * response_length,
                status=Sample.Status.COMPLETED,
            )
            for i in range(size)
        ]
        for g in range(groups)
    ]


def check_reward(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, samples: list[Sample] | None = None
) -> list[Any]:
    """A reward returns a number, a dict or None (invalid) for each sample; a group reward returns one per
    sample and an empty list for an empty group. ``name`` is resolved as the run resolves it (a rubric
    ``a:0.7,b:0.3`` and a ``boxed_`` prefix too) and called as the rollout loop calls it
    (:func:`rlsdk.plugins.calls.call_reward`, under ``args.reward_timeout``), so a reward that fails here
    raises the loop's error. Returns the rewards."""
    args = args or RolloutConfig()
    resolved = RunPlugins(args, pm).resolve("reward", name)
    samples = samples if samples is not None else make_group([None, None])

    def reward(target: Any) -> Any:
        return run_to_completion(call_reward(resolved, args, target, timeout=args.reward_timeout))

    if resolved.record.group:
        assert reward([]) == [], f"{resolved.describe()} must return [] for an empty group"
        return reward(samples)
    return [reward(sample) for sample in samples]


def score(
    pm: RlsdkPluginManager, samples: list[Sample], args: RolloutConfig | None = None, evaluation: bool = False
) -> list[Sample]:
    """Score ``samples`` with the plugins of ``pm`` as the rollout step does (``args.rm_type``, a sample's own
    ``metadata["rm_type"]`` or ``custom_rm_path``, group rewards per group, the invalid-reward policy's
    markings): each sample without a reward gets one, or is marked invalid with the reason in
    ``metadata["reward_error"]``. Returns the samples."""
    args = args or RolloutConfig()
    run_to_completion(score_group(args, RunPlugins(args, pm), samples, evaluation=evaluation))
    return samples


def scored(
    pm: RlsdkPluginManager,
    response: str,
    label: Any = None,
    args: RolloutConfig | None = None,
    metadata: dict[str, Any] | None = None,
) -> Sample:
    """A finished sample with ``response`` (``label``, ``metadata``) scored by :func:`score`: its ``reward``,
    or None with the reason in ``metadata["reward_error"]``."""
    sample = Sample(
        group_index=0,
        index=0,
        response=response,
        label=label,
        metadata=dict(metadata or {}),
        status=Sample.Status.COMPLETED,
    )
    return score(pm, [sample], args)[0]


def check_dynamic_filter(
    pm: RlsdkPluginManager,
    name: str,
    args: RolloutConfig | None = None,
    groups: list[list[Sample]] | None = None,
) -> list[DynamicFilterOutput]:
    """A dynamic filter gives a verdict for every group, including a single sample, equal rewards, invalid
    rewards and an empty group, called as the rollout loop calls it
    (:func:`rlsdk.plugins.calls.call_dynamic_filter`). Returns the verdicts."""
    args = args or RolloutConfig()
    resolved = pm.resolve("dynamic_filter", name)
    groups = (
        groups
        if groups is not None
        else [
            make_group([0.0, 1.0, 1.0, 0.0]),
            make_group([1.0, 1.0]),
            make_group([0.5]),
            make_group([None, 1.0]),
            [],
        ]
    )
    return [run_to_completion(call_dynamic_filter(resolved, args, group)) for group in groups]


def check_over_sampling_filter(
    pm: RlsdkPluginManager,
    name: str,
    args: RolloutConfig | None = None,
    groups: list[list[Sample]] | None = None,
) -> list[list[Sample]]:
    """An over-sampling filter returns groups taken from its input, none twice, and [] for [], as the rollout
    loop checks it (:func:`rlsdk.plugins.calls.call_over_sampling_filter`). Returns its order."""
    args = args or RolloutConfig()
    resolved = pm.resolve("over_sampling_filter", name)
    groups = (
        groups
        if groups is not None
        else [
            make_group([0.0, 1.0], group_index=0),
            make_group([1.0, 1.0], group_index=1),
            make_group([0.0, 0.5, 1.0], group_index=2),
        ]
    )
    result = run_to_completion(call_over_sampling_filter(resolved, args, groups))
    assert run_to_completion(call_over_sampling_filter(resolved, args, [])) == [], (
        f"{resolved.describe()} must return [] for no groups"
    )
    return result


def check_buffer_filter(
    pm: RlsdkPluginManager,
    name: str,
    args: RolloutConfig | None = None,
    num_samples: int = 2,
    rollout_id: int = 0,
    may_drop: bool = False,
) -> list[list[Sample]]:
    """A buffer filter serves at most ``num_samples`` groups, removes exactly those from the buffer and loses
    none (unless ``may_drop``, for filters that discard stale groups); an empty buffer gives []. Called as the
    data source calls it (:func:`rlsdk.plugins.calls.call_buffer_filter`). Returns the groups served."""
    args = args or RolloutConfig()
    resolved = pm.resolve("buffer_filter", name)
    groups = [make_group([0.0, 1.0], group_index=i) for i in range(5)]
    taken, left = call_buffer_filter(resolved, args, rollout_id, groups, num_samples)
    dropped = len(groups) - len(left) - len(taken)
    assert not dropped or may_drop, f"{resolved.describe()} lost {dropped} groups"
    assert call_buffer_filter(resolved, args, rollout_id, [], num_samples)[0] == [], (
        f"{resolved.describe()}: an empty buffer must serve []"
    )
    return taken


def check_loss(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> tuple[Any, dict[str, Any]]:
    """A loss returns a scalar tensor that gradients flow through and a dict of detached scalar metrics,
    for a micro-batch of two samples (one with a masked token) over uniform logits in the layout its
    record asks for (``logits``). Returns both."""
    import torch

    args = args or RolloutConfig()
    resolved = pm.resolve("loss", name)
    lengths = [3, 1]
    batch: dict[str, Any] = {
        "unconcat_tokens": [torch.tensor([0, 1, 2, 2, 2]), torch.tensor([0, 1, 2])],
        "total_lengths": [5, 3],
        "response_lengths": lengths,
        "loss_masks": [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0])],
        "advantages": [torch.tensor([0.5, 0.5, 0.5]), torch.tensor([-1.0])],
        "log_probs": [],
        "rollout_log_probs": [torch.full((n,), -1.0986) for n in lengths],
        "ref_log_probs": [torch.full((n,), -1.0986) for n in lengths],
        "rewards": [1.0, 0.0],
    }
    from .training.losses import sum_of_sample_mean_fn

    rows = sum(lengths) if resolved.record.logits == "response" else sum(batch["total_lengths"])
    logits = torch.zeros(1, rows, 3, requires_grad=True)  # the layout the record asks for
    result = resolved.func(args, batch, logits, sum_of_sample_mean_fn(lengths, batch["loss_masks"]))
    assert isinstance(result, tuple) and len(result) == 2, (
        f"{resolved.describe()} must return (loss, metrics)"
    )
    loss, metrics = result
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, (
        f"{resolved.describe()}: loss must be a scalar tensor"
    )
    assert bool(torch.isfinite(loss)), f"{resolved.describe()} returned a non-finite loss {loss}"
    loss.backward()
    assert logits.grad is not None, f"{resolved.describe()}: no gradient reaches the logits"
    assert isinstance(metrics, dict), f"{resolved.describe()}: metrics must be a dict"
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor | float | int) and not getattr(value, "requires_grad", False), (
            f"{resolved.describe()}: metric {key!r} must be a detached scalar"
        )
    return loss, metrics


def check_trainer(pm: RlsdkPluginManager, name: str, args: RolloutConfig) -> Any:
    """A trainer built from ``args`` (whose ``hf_checkpoint`` names a small model folder) is a
    :class:`rlsdk.trainer_api.PolicyTrainer`: a train step on two groups returns numeric ``train/*``
    metrics, its log-probs cover each response token, its weights are a state dict, and a checkpoint
    saved and loaded gives back the same log-probs. Returns the trainer."""
    import math
    import tempfile

    resolved = pm.resolve("trainer", name)
    trainer = build_trainer(resolved, args)
    groups = make_train_groups()
    metrics = trainer.train_step(0, groups)
    assert metrics and all(
        k.startswith("train/") and isinstance(v, int | float) and math.isfinite(v) for k, v in metrics.items()
    ), f"{resolved.describe()}: bad metrics {metrics}"
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
    assert all(
        abs(a - b) < 1e-4 for x, y in zip(log_probs, again, strict=True) for a, b in zip(x, y, strict=True)
    ), f"{resolved.describe()}: a loaded checkpoint does not give back the saved policy"
    return trainer


def check_tool_call_parser(pm: RlsdkPluginManager, name: str) -> Resolved:
    """A tool-call parser returns a ParsedTurn: plain text is all content with no call, and the calls its
    ``format_calls`` writes parse back to the same calls."""
    resolved = pm.resolve("tool_call_parser", name)
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    plain = resolved.func("The answer is 4.", tools)
    assert isinstance(plain, ParsedTurn), (
        f"{resolved.describe()} must return a ParsedTurn, got {plain!r:.100}"
    )
    assert plain.calls == [] and plain.content == "The answer is 4.", (
        f"{resolved.describe()}: plain text {plain}"
    )
    format_calls = getattr(resolved.record, "format_calls", None)
    if format_calls is not None:
        calls = [FunctionCall("calculator", {"expression": "2 + 2"})]
        parsed = resolved.func(format_calls(calls), tools)
        assert parsed.calls == calls, f"{resolved.describe()}: its own format_calls parsed as {parsed.calls}"
    return resolved


def check_plugin(pm: RlsdkPluginManager, kind: str, name: str, *arguments: Any) -> Any:
    """Any kind's plugin called once with ``arguments`` (its record's ``call_args``, in order) through the
    generic call point (:func:`rlsdk.plugins.calls.call_plugin`), its result checked as its kind declares,
    as a run calls a kind that has no call point of its own. Returns what the plugin gave."""
    resolved = pm.resolve(kind, name)
    expected = resolved.record.call_args
    if len(arguments) != len(expected):
        raise TypeError(f"check_plugin for {kind}: give the call's {len(expected)} arguments {expected}")
    return call_plugin(resolved, *arguments)


def check_callable(pm: RlsdkPluginManager, kind: str, name: str) -> Resolved:
    """Resolve and validate the signature (for kinds that need an engine or data to run)."""
    resolved = pm.resolve(kind, name)
    if kind == "custom_generate":
        assert resolved.is_async, f"{resolved.describe()} must be an async function"
    return resolved


def check_custom_generate(
    pm: RlsdkPluginManager,
    name: str,
    replies: Sequence[str | FakeReply] | Respond,
    args: RolloutConfig | None = None,
    tokenizer: Any = None,
    prompt: str = "What is 2 + 3?",
) -> Sample:
    """Run a custom generator on one sample against a :class:`FakeEngine` answering with ``replies``
    (``tokenizer`` defaults to :class:`ByteTokenizer`; :class:`ChatTokenizer` for one with a chat template):
    it returns the sample, finished or truncated, with a prompt (the sample's tokens, or ones the generator
    rendered itself: a system prompt added, a chat template applied) followed by its response tokens, one per
    ``loss_mask`` and log-prob entry, after at least one engine call. Returns the sample."""
    args = args or RolloutConfig()
    resolved = check_callable(pm, "custom_generate", name)
    engine = FakeEngine(replies, tokenizer)
    runtime = bind_runtime(args, Runtime(pm, engine, engine.tokenizer))
    prompt_ids = list(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    sample = Sample(group_index=0, index=0, prompt=prompt, tokens=list(prompt_ids), label="5")
    try:
        result = runtime.run(resolved.func(args, sample, sampling_params_for(args)))
    finally:
        runtime.loop.close()
    where = resolved.describe()
    assert isinstance(result, Sample), f"{where} returned {type(result).__name__}, expected the Sample"
    finished = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED)
    assert result.status in finished, f"{where} left the sample {result.status}"
    assert engine.requests > 0, f"{where} never called the engine"
    prompt_length = len(result.tokens) - result.response_length
    if result.tokens[: len(prompt_ids)] == prompt_ids:  # the sample's own prompt tokens, then the response
        as_given = prompt_length == len(prompt_ids)
    else:  # a prompt the generator rendered itself still holds the prompt's text
        as_given = prompt_length > 0 and prompt in engine.tokenizer.decode(result.tokens[:prompt_length])
    assert as_given, (
        f"{where} changed the prompt's tokens: {len(result.tokens)} tokens for a prompt of {len(prompt_ids)} "
        f"and a response of {result.response_length}, and its prompt part does not hold the prompt {prompt!r}"
    )
    for field in ("loss_mask", "rollout_log_probs"):
        values = getattr(result, field)
        assert values is None or len(values) == result.response_length, (
            f"{where}: {field} has {len(values)} entries for {result.response_length} response tokens"
        )
    return result


def tool_definition(name: str, description: str, *parameters: str) -> dict[str, Any]:
    """An OpenAI-style function definition, a chat request's ``tools`` entry, whose ``parameters`` are strings:
    ``tool_definition("calculator", "Arithmetic.", "expression")``."""
    properties = {parameter: {"type": "string"} for parameter in parameters}
    schema = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


class ServedEngine:
    """An engine served over HTTP on loopback from a background thread's event loop, for tests that
    talk to it as a real client would::

        from rlsdk.engine_api import SGLangClient
        from rlsdk.testing import ChatTokenizer, FakeEngine, ServedEngine

        with ServedEngine(FakeEngine(["Hi there.<|im_end|>"], ChatTokenizer())) as served:
            asyncio.run(SGLangClient(served.url).generate(...))
            served.run(served.engine.abort())  # a coroutine on the engine's own loop

    Any engine works (an installed engine plugin's too); with a tokenizer that has a chat template (as
    :class:`ChatTokenizer`) it also answers ``/v1/chat/completions`` and ``/v1/messages``, and
    :func:`check_agent` runs an agent against it."""

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
    plugins only). ``service`` is the plugin manager whose tasks it runs, trajectories kept in ``folder``
    and ``service_options`` as ``rlsdk buffer serve`` takes them (``input_dirs``, ``url_hosts``), or a service
    already built; ``server_options`` as its server takes them (``token``)::

        with ServedBuffer(pm, tmp_path / "buffer", service_options={"input_dirs": [tmp_path]}) as served:
            httpx.post(served.url + "/buffer/write", json=item)
    """

    def __init__(
        self,
        service: Any,
        folder: Any = None,
        *,
        service_options: dict[str, Any] | None = None,
        **server_options: Any,
    ) -> None:
        if not isinstance(service, BufferService):  # the plugin manager of a new service
            service = BufferService(service, TrajectoryStore(folder), **(service_options or {}))
        self.service: BufferService = service
        self.server_options = server_options
        self.server: Any = None

    @property
    def url(self) -> str:
        return self.service.url

    def __enter__(self) -> ServedBuffer:
        self._loop = BackgroundLoop("rlsdk-served-buffer")
        self.server = self._loop.run(
            start_buffer_server(self.service, "127.0.0.1", 0, **self.server_options), 30
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.run(self.server.close(), 30)
        self._loop.close()


def check_task_generator(
    pm: RlsdkPluginManager, name: str, body: dict[str, Any] | None = None, *, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """A task generator, started by a rollout buffer service on loopback through ``POST /start_rollout`` with
    ``body`` (``task_type`` and ``num_repeat_per_sample: 1`` by default; the folder of its ``input_file`` is
    allowed), finishes within ``timeout`` seconds without an error, and what it wrote makes at least one
    complete group (its ``is_valid_group``, ``transform_group`` and ``get_group_data_meta_info`` applied) for
    ``POST /get_rollout_data``, as the buffer service runs it for a trainer. Returns the items served."""
    import httpx

    resolved = pm.resolve("task_generator", name, registered_only=True)
    body = {"task_type": resolved.name, "num_repeat_per_sample": 1, **(body or {})}
    inputs = [Path(body["input_file"]).resolve().parent] if isinstance(body.get("input_file"), str) else []
    with tempfile.TemporaryDirectory(prefix="rlsdk-buffer-") as folder:
        with ServedBuffer(pm, folder, service_options={"input_dirs": inputs}) as served:
            service = served.service
            started = httpx.post(served.url + "/start_rollout", json=body, timeout=30)
            assert started.status_code == 200, (
                f"{resolved.describe()}: /start_rollout answered {started.text}"
            )
            task = service.tasks[resolved.name]
            task.join(timeout)
            assert not task.is_alive(), f"{resolved.describe()} still running after {timeout:g}s"
            assert not service.task_errors, service.task_errors[0]
            answer = httpx.post(served.url + "/get_rollout_data", json={}, timeout=30)
    assert answer.status_code == 200, f"/get_rollout_data answered {answer.text}"
    items: list[dict[str, Any]] = answer.json()["data"]["data"]
    assert items, f"{resolved.describe()} wrote no complete group of {body['num_repeat_per_sample']}"
    return items


@dataclass
class FakeReply:
    """One answer of :class:`FakeEngine`: the response as text, token ids or both (the engine's tokenizer
    makes the other), how long it runs, and what an abort returns."""

    text: str | None = None
    ids: list[int] | None = None
    seconds: float = 0.0
    """Time the request runs on the event loop's clock before it finishes, unless aborted first."""
    partial_tokens: int | None = None
    """Tokens an abort returns; default: those produced by then at an even pace over ``seconds``."""
    abort: bool = False
    """The engine aborts the request itself (``finish_reason`` ``abort``, the whole response)."""
    logprobs: list[float] | None = None
    """One per token; default ``-call - position / 1000``, distinct per request and token."""


Respond = Callable[[dict[str, Any], int], "str | FakeReply"]
"""``respond(payload, call)`` gives the answer to the ``call``-th request (counted from 1)."""


class FakeEngine(InferenceEngine):
    """An engine without a model, for tests and benchmarks: it answers each ``/generate`` in SGLang's
    shapes (:mod:`rlsdk.engines.protocol`) with the next of ``replies`` (a list of strings or
    :class:`FakeReply`) or with what ``replies(payload, call)`` returns, tokenized by ``tokenizer`` (default
    :class:`ByteTokenizer`)::

        engine = FakeEngine(["The answer is 5.<|im_end|>"], tokenizer)

    Like SGLang it stops at a ``stop`` string or an ending ``tokenizer.eos_token`` (both stay in the ids;
    in the text only with ``no_stop_trim``, which rlsdk's sampling parameters set) and at
    ``max_new_tokens`` (finish reason ``length``). A reply with ``seconds`` runs that long unless
    :meth:`abort` ends it first; with ``slots`` at most that many run at once and the rest wait in order.
    ``payloads`` records every request (``keep_payloads=False`` keeps only the count, for benchmarks)."""

    def __init__(
        self,
        replies: Sequence[str | FakeReply] | Respond,
        tokenizer: Any = None,
        *,
        slots: int | None = None,
        keep_payloads: bool = True,
        model_path: str = "fake",
    ) -> None:
        self.respond: Respond = replies if callable(replies) else self._next_turn
        self.turns = [] if callable(replies) else list(replies)
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.slots, self.keep_payloads, self.model_path = slots, keep_payloads, model_path
        self.weight_version = "default"
        self.payloads: list[dict[str, Any]] = []
        self.requests = 0
        self.aborts = 0
        self.generated_tokens = 0
        self.busy_seconds = 0.0
        """Seconds requests spent running (summed over requests; waiting for a slot not counted)."""
        self._busy = 0
        self._queue: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._live: dict[asyncio.Future[bool], str] = {}

    def _next_turn(self, payload: dict[str, Any], call: int) -> str | FakeReply:
        if not self.turns:
            raise AssertionError(f"FakeEngine: no scripted reply left for request {call}")
        return self.turns.pop(0)

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        ids_in = payload.get("input_ids")
        if (type(ids_in) is list and ids_in and type(ids_in[0]) is list) or type(payload.get("text")) is list:
            bodies = protocol.split_batch(payload) or []
            answers = await asyncio.gather(*(self.generate(body) for body in bodies))
            return typing.cast(list[dict[str, Any]], list(answers))  # one answer per single request
        self.requests += 1
        if self.keep_payloads:
            self.payloads.append(payload)
        call = self.requests
        given = self.respond(payload, call)
        reply = FakeReply(text=given) if isinstance(given, str) else given
        params = payload.get("sampling_params") or {}
        text, ids, finish = self._response(reply, params)
        rid = payload.get("rid") or f"fake-{call}"
        if reply.seconds or self.slots is not None:
            done = await self._run(rid, reply.seconds)
            if done < 1.0:
                cut = reply.partial_tokens
                ids = ids[: int(done * len(ids) + 1e-9) if cut is None else cut]
                text = self.tokenizer.decode(ids)
                finish = protocol.finish_abort()
        if reply.abort:
            finish = protocol.finish_abort()
        self.generated_tokens += len(ids)
        logprobs = None
        if payload.get("return_logprob"):
            logprobs = (
                reply.logprobs[: len(ids)]
                if reply.logprobs is not None
                else [-call - j / 1000 for j in range(len(ids))]
            )
        return protocol.generate_response(
            rid=rid,
            text=text,
            output_ids=ids,
            prompt_tokens=len(ids_in) if type(ids_in) is list else 0,
            finish_reason=finish,
            weight_version=self.weight_version,
            logprobs=logprobs,
            sent_ts=False,
        )

    def _response(self, reply: FakeReply, params: dict[str, Any]) -> tuple[str, list[int], dict[str, Any]]:
        """The reply's text and ids cut as SGLang would cut them, and the finish reason."""
        text, ids, finish = reply.text, reply.ids, protocol.finish_stop(None)
        keep = params.get("no_stop_trim", False)
        if ids is None:
            assert text is not None, "FakeReply needs text or ids"
            hits = [(text.find(s) + len(s), s) for s in params.get("stop") or [] if s in text]
            eos = getattr(self.tokenizer, "eos_token", None)
            if hits:
                end, matched = min(hits)
                text, finish = text[:end], protocol.finish_stop(matched)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if hits and not keep:
                text = text[: -len(finish["matched"])]
            elif not hits and eos and text.endswith(eos):
                text, finish = text if keep else text[: -len(eos)], protocol.finish_stop(ids[-1])
        elif text is None:
            text = self.tokenizer.decode(ids)
        limit = params.get("max_new_tokens")
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
            text, finish = self.tokenizer.decode(ids), protocol.finish_length(limit)
        return text, ids, finish

    async def _run(self, rid: str, seconds: float) -> float:
        """Take a slot (waiting in order when ``slots`` are all busy), run ``seconds`` on the loop's clock;
        the share done, which is below 1 when aborted first."""
        loop = asyncio.get_running_loop()
        if self.slots is not None:
            if self._busy < self.slots:
                self._busy += 1
            else:
                turn = loop.create_future()
                self._queue.append(turn)
                if await self._until_settled(turn, rid):
                    return 0.0  # aborted while waiting
        started = loop.time()
        done = loop.create_future()
        handle = loop.call_later(seconds, _settle, done, False)
        try:
            aborted = await self._until_settled(done, rid)
        finally:
            handle.cancel()
            elapsed = loop.time() - started
            self.busy_seconds += elapsed
            if self.slots is not None:
                self._busy -= 1
                self._admit()
        return min(1.0, elapsed / seconds) if aborted and seconds else 1.0

    async def _until_settled(self, future: asyncio.Future[bool], rid: str) -> bool:
        self._live[future] = rid
        try:
            return await future
        finally:
            del self._live[future]

    def _admit(self) -> None:
        assert self.slots is not None
        while self._queue and self._busy < self.slots:
            turn = self._queue.popleft()
            if not turn.done():
                self._busy += 1
                turn.set_result(False)

    async def abort(self, rid: str | None = None) -> None:
        """End the requests still running or waiting (all, or the one with ``rid``) as aborted."""
        self.aborts += 1
        for future, owner in list(self._live.items()):
            if rid is None or owner == rid:
                _settle(future, True)

    async def load(self) -> dict[str, int]:
        waiting = sum(not f.done() for f in self._queue)
        return {"num_running_reqs": len(self._live) - waiting, "num_waiting_reqs": waiting}

    async def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "tokenizer_path": None, "weight_version": self.weight_version}


def _settle(future: asyncio.Future[bool], aborted: bool) -> None:
    if not future.done():
        future.set_result(aborted)
