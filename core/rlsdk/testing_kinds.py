"""Contract checks for the kinds beyond the rollout filters (re-exported by :mod:`rlsdk.testing`): each resolves
the plugin by name in the given manager and calls it through its kind's call point
(:mod:`rlsdk.plugins.calls`, or :func:`rlsdk.call_tool` for tools), as the run does, so a plugin that passes
here behaves the same in a run. Each returns what the plugin gave, for the author's own assertions."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from .config import RolloutConfig
from .data import BadRowPolicy, DataPath, read_rows
from .plugins import calls
from .plugins.manager import RlsdkPluginManager
from .plugins.run_plugins import RunPlugins
from .rollout.generate import sampling_params_for
from .rollout.tools import ToolResult, call_tool
from .runtime import Runtime, bind_runtime
from .types import RolloutFnTrainOutput, Sample
from .plugins.kinds import Agent, CustomGenerate


def _finished(rewards: list[float | None], group_index: int = 0, response_length: int = 2) -> list[Sample]:
    return [
        Sample(
            group_index=group_index,
            index=2 * group_index + i,
            prompt=f"prompt {group_index}",
            response="answer",
            tokens=[1, 2, *range(3, 3 + response_length)],
            response_length=response_length,
            loss_mask=[1] * response_length,
            rollout_log_probs=[-1.0] * response_length,
            reward=reward,
            label="answer",
            status=Sample.Status.COMPLETED,
        )
        for i, reward in enumerate(rewards)
    ]


# ----- samples and data ------------------------------------------------------------------------------------


def check_sample_hook(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, sample: Sample | None = None
) -> Sample:
    """A sample hook gives back a Sample (or None: the one it got) for a finished sample, in training and in
    eval, as the rollout step calls it (:func:`rlsdk.plugins.calls.call_sample_hooks`). Returns the sample."""
    args = args or RolloutConfig()
    resolved = pm.resolve("sample_hook", name)
    out = sample or _finished([None])[0]
    for evaluation in (False, True):
        out = calls.run_to_completion(
            calls.call_sample_hooks([resolved], args, out, rollout_id=0, evaluation=evaluation)
        )
        assert "generate_error" not in out.metadata, out.metadata.get("generate_error")
    return out


def check_rollout_sample_filter(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> list[list[Sample]]:
    """A sample filter marks samples of a step's kept groups ``remove_sample`` and keeps every group whole
    (:func:`rlsdk.plugins.calls.call_rollout_sample_filter`). Returns the groups, marked."""
    args = args or RolloutConfig()
    resolved = pm.resolve("rollout_sample_filter", name)
    groups = [_finished([1.0, 0.0]), _finished([0.5, 0.5], 1)]
    calls.call_rollout_sample_filter(resolved, args, groups)
    return groups


def check_all_samples_process(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> None:
    """An all-samples processor takes a step's groups, kept and dropped, with the data source
    (:func:`rlsdk.plugins.calls.call_all_samples_process`); ``args.output_dir`` is a temporary folder by
    default, there as in a run."""
    args = args or RolloutConfig(output_dir=tempfile.mkdtemp(prefix="rlsdk-all-samples-"))
    groups = [_finished([1.0, 0.0]), _finished([None, None], 1)]
    calls.call_all_samples_process(pm.resolve("all_samples_process", name), args, groups, None)


def check_data_source(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, num_groups: int = 2
) -> list[list[Sample]]:
    """A data source built from ``args`` serves ``num_groups`` groups of Samples, takes groups back with
    ``add_samples``, and (with ``state_dict``) restores its position from a JSON-safe state, as ``rlsdk run``
    builds it (:func:`rlsdk.plugins.calls.call_data_source`). Returns the groups served."""
    args = args or RolloutConfig()
    resolved = pm.resolve("data_source", name)
    source = calls.call_data_source(resolved, args)
    groups = source.get_samples(num_groups)
    assert isinstance(groups, list) and len(groups) <= num_groups, (
        f"{resolved.describe()}: get_samples({num_groups}) returned {type(groups).__name__} of {len(groups)}"
    )
    assert all(isinstance(g, list) and g and all(isinstance(s, Sample) for s in g) for g in groups), (
        f"{resolved.describe()}: get_samples must return non-empty lists of Sample"
    )
    if callable(getattr(source, "state_dict", None)):
        state = json.loads(json.dumps(source.state_dict()))
        again = calls.call_data_source(resolved, args)
        again.load_state_dict(state)
        assert [s.prompt for g in again.get_samples(1) for s in g] == [
            s.prompt for g in source.get_samples(1) for s in g
        ], f"{resolved.describe()}: a restored state_dict serves other prompts than the saved source"
    if groups:
        source.add_samples(groups[:1])
    return groups


def check_environment(pm: RlsdkPluginManager, name: str, train: bool = False) -> RolloutConfig:
    """An environment's settings are known run options, its dataset reads (a file inside its package) and its
    reward (or rubric), generator and eval sets resolve in ``pm``, as ``rlsdk run --env NAME`` takes them
    (:func:`rlsdk.plugins.calls.call_environment`). Returns the run configuration it gives."""
    resolved = pm.resolve("environment", name)
    calls.call_environment(resolved)
    args = RolloutConfig.from_dict({"env": name, "train": train}, pm=pm)
    if args.prompt_data:
        assert read_rows(DataPath.parse(args.prompt_data), BadRowPolicy("error")), (
            f"{resolved.describe()}: {args.prompt_data} has no rows"
        )
    for spec in args.eval_datasets:
        assert Path(spec["path"]).is_file(), f"{resolved.describe()}: eval set {spec['path']} does not exist"
    plugins = RunPlugins(args, pm)
    plugins.reward  # noqa: B018 (resolved: an unknown reward is an error here)
    plugins.one(CustomGenerate)
    plugins.get(Agent)
    return args


# ----- logging and checkpoints -----------------------------------------------------------------------------


def check_rollout_log(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> bool:
    """A step logging backend takes a step's samples and metrics (writing under ``args.output_dir``, a
    temporary folder by default) and returns a bool (:func:`rlsdk.plugins.calls.call_rollout_log`)."""
    args = args or RolloutConfig(output_dir=tempfile.mkdtemp(prefix="rlsdk-log-"))
    resolved = pm.resolve("rollout_log", name)
    samples = _finished([1.0, 0.0])
    metrics = {"rollout/reward_mean": 0.5, "rollout/samples": 2, "rollout/failures": []}
    return calls.call_rollout_log(resolved, 0, args, samples, metrics, 1.5)


def check_rollout_metrics(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, samples: list[Sample] | None = None
) -> dict[str, float]:
    """A step's metrics plugin takes the samples a step trains on (default: a kept group of two) and returns
    a dict of metric names to finite numbers, called as each step calls it
    (:func:`rlsdk.plugins.calls.call_plugin`). Returns the metrics (a run writes them as ``custom/<name>``)."""
    args = args or RolloutConfig()
    resolved = pm.resolve("rollout_metrics", name)
    return calls.call_plugin(resolved, args, 0, samples if samples is not None else _finished([1.0, 0.0]))


def check_eval_rollout_log(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> bool:
    """An eval logging backend takes an eval's data and metrics and returns a bool
    (:func:`rlsdk.plugins.calls.call_eval_rollout_log`)."""
    args = args or RolloutConfig(output_dir=tempfile.mkdtemp(prefix="rlsdk-log-"))
    resolved = pm.resolve("eval_rollout_log", name)
    samples = _finished([1.0, 0.0])
    data = {"held-out": {"rewards": [1.0, 0.0], "truncated": [False, False], "samples": samples}}
    return calls.call_eval_rollout_log(resolved, -1, args, data, {"eval/held-out/reward_mean": 0.5})


def check_checkpoint_callback(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, folder: Path | None = None
) -> Path:
    """A checkpoint callback runs on a complete checkpoint folder (``folder``; by default an empty temporary
    one named ``step_0``) (:func:`rlsdk.plugins.calls.call_checkpoint_callback`). Returns the folder."""
    args = args or RolloutConfig()
    resolved = pm.resolve("checkpoint_callback", name)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="rlsdk-ckpt-")) / "step_0"
        folder.mkdir()
    calls.call_checkpoint_callback(resolved, args, 0, folder)
    return folder


# ----- training ----------------------------------------------------------------------------------------------


def _rollout_data() -> dict[str, Any]:
    import torch

    lengths = [3, 1, 2, 2]
    return {
        "rewards": [1.0, 0.0, 0.5, 0.5],
        "raw_reward": [1.0, 0.0, 0.5, 0.5],
        "kl": [torch.zeros(n) for n in lengths],
        "loss_masks": [torch.ones(n) for n in lengths],
        "response_lengths": lengths,
        "total_lengths": [n + 2 for n in lengths],
        "rollout_log_probs": [torch.full((n,), -1.0) for n in lengths],
        "log_probs": [torch.full((n,), -1.1) for n in lengths],
        "truncated": [0, 0, 1, 0],
        "sample_indices": [0, 1, 2, 3],
    }


def check_advantage(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> list[Any]:
    """An advantage estimator sets one finite per-token tensor per sample, each of its response's length, as the
    trainer calls it (:func:`rlsdk.plugins.calls.call_advantage`). Returns the advantages."""
    import torch

    args = args or RolloutConfig()
    resolved = pm.resolve("advantage", name)
    data = _rollout_data()
    advantages = calls.call_advantage(resolved, args, data)
    for advantage, n in zip(advantages, data["response_lengths"], strict=True):
        tensor = torch.as_tensor(advantage)
        assert tensor.numel() == n, (
            f"{resolved.describe()}: an advantage of {tensor.numel()} values for {n} tokens"
        )
        assert bool(torch.isfinite(tensor).all()), f"{resolved.describe()}: non-finite advantages {tensor}"
    return advantages


def check_reward_post_process(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> tuple[list[float], list[float]]:
    """Reward post-processing gives raw and processed rewards, finite, one each per sample
    (:func:`rlsdk.plugins.calls.call_reward_post_process`)."""
    args = args or RolloutConfig()
    resolved = pm.resolve("reward_post_process", name)
    return calls.call_reward_post_process(resolved, args, _finished([1.0, 0.0]) + _finished([0.5, 0.5], 1))


def check_rollout_data_postprocess(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> dict[str, Any]:
    """Training-data post-processing edits the step's data in place, one entry per sample kept
    (:func:`rlsdk.plugins.calls.call_rollout_data_postprocess`). Returns the data."""
    args = args or RolloutConfig()
    resolved = pm.resolve("rollout_data_postprocess", name)
    data = _rollout_data()
    calls.call_rollout_data_postprocess(resolved, args, 0, data)
    return data


def check_convert_samples_to_train_data(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> dict[str, Any]:
    """A converter gives slime's training-data dict for a step's samples
    (:func:`rlsdk.plugins.calls.call_convert_samples_to_train_data`)."""
    args = args or RolloutConfig()
    resolved = pm.resolve("convert_samples_to_train_data", name)
    return calls.call_convert_samples_to_train_data(resolved, args, _finished([1.0, 0.0]))


def check_pg_loss_reducer(pm: RlsdkPluginManager, name: str, calculate_per_token_loss: bool = False) -> Any:
    """A pg-loss reducer turns a micro-batch's per-token loss into a finite scalar that gradients flow through
    (:func:`rlsdk.plugins.calls.call_pg_loss_reducer`). Returns the scalar."""
    import torch

    resolved = pm.resolve("pg_loss_reducer", name)
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0])]
    reduce = calls.call_pg_loss_reducer(resolved, [5, 3], [3, 1], masks, calculate_per_token_loss)
    x = torch.tensor([0.5, -1.0, 2.0, 0.25], requires_grad=True)
    value = reduce(x)
    assert bool(torch.isfinite(value)), f"{resolved.describe()}: reduced to {value}"
    value.backward()
    assert x.grad is not None, f"{resolved.describe()}: no gradient reaches the per-token loss"
    return value


def check_tis_function(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None
) -> tuple[Any, ...]:
    """A TIS function, called by keyword as the loss calls it, keeps the loss's shape and gives one mask per
    sample and a dict of metrics (:func:`rlsdk.plugins.calls.call_tis_function`)."""
    import torch

    args = args or RolloutConfig(use_tis=True)
    resolved = pm.resolve("tis_function", name)
    return calls.call_tis_function(
        resolved,
        args=args,
        pg_loss=torch.tensor([0.5, -1.0, 2.0, 0.25]),
        train_log_probs=[torch.tensor([-1.0, -0.5, -2.0]), torch.tensor([-0.1])],
        rollout_log_probs=[torch.tensor([-1.1, -0.4, -2.5]), torch.tensor([-0.1])],
        loss_masks=[torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0])],
        total_lengths=[5, 3],
        response_lengths=[3, 1],
    )


# ----- engines, rollouts, tools and agents ------------------------------------------------------------------


def check_engine(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> Any:
    """An engine factory builds an :class:`rlsdk.engine_api.InferenceEngine` from ``args``
    (:func:`rlsdk.plugins.calls.call_engine`). Returns the engine (close it when done)."""
    return calls.call_engine(pm.resolve("engine", name), args or RolloutConfig())


def check_generate_rollout(
    pm: RlsdkPluginManager, name: str, engine: Any, args: RolloutConfig, data_source: Any
) -> RolloutFnTrainOutput:
    """One training step of a rollout on ``engine`` (a :class:`rlsdk.testing.FakeEngine`, say) returns groups of
    finished, rewarded samples, as ``rlsdk run`` calls it (:func:`rlsdk.plugins.calls.call_generate_rollout`).
    Returns the output."""
    resolved = pm.resolve("generate_rollout", name)
    runtime = bind_runtime(args, Runtime(pm, engine, engine.tokenizer))
    try:
        output = calls.call_generate_rollout(resolved, args, 0, data_source, runtime=runtime)
    finally:
        runtime.loop.close()
    for group in output.samples:
        for sample in group:
            assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), (
                f"{resolved.describe()} kept a sample {sample.status}"
            )
            assert sample.reward is not None, f"{resolved.describe()} kept a sample without a reward"
    return output


def check_tool(
    pm: RlsdkPluginManager, name: str, arguments: dict[str, Any], args: RolloutConfig | None = None
) -> ToolResult:
    """A tool has an OpenAI function schema whose required parameters ``arguments`` give, and answers them
    with text and no error within its timeout, as multi-turn generators call it (:func:`rlsdk.call_tool`)."""
    args = args or RolloutConfig()
    tool = pm.resolve("tool", name).record
    schema = tool.schema()
    assert schema["type"] == "function" and schema["function"]["name"] == tool.name, schema
    parameters = schema["function"]["parameters"]
    assert parameters.get("type") == "object" and isinstance(parameters.get("properties"), dict), parameters
    missing = [p for p in parameters.get("required", []) if p not in arguments]
    assert not missing, f"tool {tool.name!r}: arguments lack the required {missing}"
    result = calls.run_to_completion(call_tool(tool, args, arguments))
    assert result.error is None, result.error
    return result


def check_agent(
    pm: RlsdkPluginManager,
    name: str,
    served: Any,
    args: RolloutConfig | None = None,
    prompt: str = "Say hi.",
    generator: str = "openai_agent",
    sampling_params: dict[str, Any] | None = None,
) -> Sample:
    """An agent, run by the ``openai_agent`` generator (or ``generator``: ``anthropic_agent`` for an agent on
    the ``anthropic`` client, its ``client.messages.create`` answered by ``/v1/messages``) against ``served`` (a
    :class:`rlsdk.testing.ServedEngine` whose engine has a chat template:
    ``ServedEngine(FakeEngine(replies, ChatTokenizer()))``) through the generator's call point
    (:func:`rlsdk.plugins.calls.call_custom_generate`), finishes its sample with at least one model turn whose
    tokens are loss-masked 1. Returns the sample (``metadata["agent"]["result"]``: what the agent returned)."""
    args = (args or RolloutConfig()).replace(agent_function_path=name)
    runtime = Runtime(pm, served.engine, served.engine.tokenizer, loop=served._loop)
    runtime.server = served.handle
    bind_runtime(args, runtime)
    resolved = runtime.plugins.resolve("custom_generate", generator)
    sample = Sample(group_index=0, index=0, prompt=prompt)
    params = sampling_params or sampling_params_for(args)
    [result] = served.run(calls.call_custom_generate(resolved, args, sample, params))
    assert "generate_error" not in result.metadata, result.metadata["generate_error"]
    assert result.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED), result.status
    assert result.loss_mask and 1 in result.loss_mask, f"agent {name!r}: no model token in its sample"
    assert math.isfinite(sum(result.rollout_log_probs or [0.0]))
    return result


# ----- the megatron trainer's hooks and the weight sync's -----------------------------------------------------


def _small_model() -> list[Any]:
    import torch

    return [torch.nn.Linear(4, 4)]


def check_megatron_init(pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None) -> None:
    """An init hook takes the run's ``args`` and returns None, as the megatron trainer calls it once megatron is
    initialised (:func:`rlsdk.plugins.calls.call_megatron_init`)."""
    calls.call_megatron_init(pm.resolve("megatron_init", name), args or RolloutConfig())


def check_megatron_before_log_prob(
    pm: RlsdkPluginManager, name: str, args: RolloutConfig | None = None, model: list[Any] | None = None
) -> list[Any]:
    """A before-log-prob hook takes ``model`` (a list of model chunks; by default one small torch module: pass
    your megatron model where the hook needs one) with the policy's and the reference model's store prefixes
    (:func:`rlsdk.plugins.calls.call_megatron_before_log_prob`). Returns the model."""
    args = args or RolloutConfig()
    resolved = pm.resolve("megatron_before_log_prob", name)
    model = model if model is not None else _small_model()
    for store_prefix in ("", "ref_"):
        calls.call_megatron_before_log_prob(resolved, args, model, store_prefix)
    return model


def check_megatron_before_train_step(
    pm: RlsdkPluginManager,
    name: str,
    args: RolloutConfig | None = None,
    model: list[Any] | None = None,
    optimizer: Any = None,
) -> tuple[list[Any], Any]:
    """A before-train-step hook takes two optimizer steps of a rollout with ``model`` (a list of chunks; by
    default one small torch module) and ``optimizer`` (by default AdamW over it) and no LR scheduler, as the
    megatron trainer calls it (:func:`rlsdk.plugins.calls.call_megatron_before_train_step`). Returns both."""
    import torch

    args = args or RolloutConfig()
    resolved = pm.resolve("megatron_before_train_step", name)
    model = model if model is not None else _small_model()
    if optimizer is None:
        optimizer = torch.optim.AdamW([p for chunk in model for p in chunk.parameters()], lr=args.lr)
    for step_id in range(2):
        calls.call_megatron_before_train_step(resolved, args, 0, step_id, model, optimizer, None)
    return model, optimizer


def check_model_provider(pm: RlsdkPluginManager, name: str, **extra: Any) -> Any:
    """A model provider builds a torch module for the whole model (``pre_process`` and ``post_process`` True,
    ``vp_stage`` None), called by keyword as the megatron trainer calls it
    (:func:`rlsdk.plugins.calls.call_model_provider`); ``extra`` (``config``, ``model_kwargs``) reaches it where
    it declares them. Returns the model, whose parameters must not be empty."""
    resolved = pm.resolve("model_provider", name)
    model = calls.call_model_provider(resolved, pre_process=True, post_process=True, vp_stage=None, **extra)
    assert any(True for _ in model.parameters()), f"{resolved.describe()} built a model without parameters"
    return model


def check_update_weight_post_write(
    pm: RlsdkPluginManager,
    name: str,
    args: RolloutConfig | None = None,
    folder: Path | None = None,
    engines: list[Any] | None = None,
) -> Path:
    """A post-write hook runs on a written weights folder (``folder``; by default a temporary one holding a
    ``config.json``) with the engines about to read it (``engines``, by default none), as the disk weight sync
    calls it (:func:`rlsdk.plugins.calls.call_update_weight_post_write`). Returns the folder."""
    args = args or RolloutConfig(weight_sync="disk")
    resolved = pm.resolve("update_weight_post_write", name)
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="rlsdk-weights-")) / "sync-weights"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    calls.call_update_weight_post_write(resolved, args, str(folder), list(engines or []))
    return folder
