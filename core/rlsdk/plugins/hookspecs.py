"""Hook specifications: one provider hook per kind of plugin.

Each hook returns (or yields) records with a name; the plugin manager collects them into one table
per kind and the engine loop resolves implementations by name. Pluggy is used for discovery only:
the loop calls the resolved callables directly.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .records import (
    Advantage,
    Agent,
    AllSamplesProcess,
    BufferFilter,
    CheckpointCallback,
    ConvertSamplesToTrainData,
    CustomGenerate,
    DataSourceFactory,
    DynamicFilter,
    Engine,
    Environment,
    EvalRolloutLog,
    GenerateRollout,
    Loss,
    MegatronBeforeLogProb,
    MegatronBeforeTrainStep,
    MegatronInit,
    ModelProvider,
    Option,
    OverSamplingFilter,
    PgLossReducer,
    Reward,
    RewardPostProcess,
    RolloutDataPostprocess,
    RolloutLog,
    RolloutSampleFilter,
    SampleHook,
    TaskGenerator,
    TisFunction,
    Tool,
    ToolCallParser,
    Trainer,
    UpdateWeightPostWrite,
)

PROJECT = "rlsdk"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -------------------------------------------------------------------------
# Rollout steps
# -------------------------------------------------------------------------


@hookspec
def rlsdk_generate_rollouts() -> Iterable[GenerateRollout]:
    """Provide whole rollout steps.

    The callable is ``generate_rollout(args, rollout_id, data_source, evaluation=False)`` and returns
    ``RolloutFnTrainOutput`` (or ``RolloutFnEvalOutput`` when ``evaluation``); a bare list of groups
    is wrapped, as slime does.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param rollout_id: the step number.
    :param data_source: the :class:`rlsdk.data.DataSource` serving groups of samples.

    **Example:**

    .. code-block:: python

        from rlsdk import GenerateRollout, RolloutFnTrainOutput, hookimpl

        def replay(args, rollout_id, data_source, evaluation=False):
            groups = data_source.get_samples(args.rollout_batch_size)
            return RolloutFnTrainOutput(samples=groups)

        @hookimpl
        def rlsdk_generate_rollouts():
            yield GenerateRollout(name="replay", func=replay, description="Serve groups unchanged")
    """


@hookspec
def rlsdk_custom_generates() -> Iterable[CustomGenerate]:
    """Provide generators that turn one sample into a response (single-turn, multi-turn, agents).

    The callable is ``async custom_generate(args, sample, sampling_params[, evaluation])`` and returns
    the sample (or a list of samples) with ``tokens``, ``response``, ``response_length``,
    ``rollout_log_probs``, ``loss_mask`` and ``status`` filled. ``evaluation`` is passed only when the
    function declares it.

    :param args: the run's :class:`rlsdk.RolloutConfig`; ``args.sglang_router_ip`` and
        ``args.sglang_router_port`` address the engine's ``/generate``.
    :param sample: the :class:`rlsdk.Sample` to complete.
    :param sampling_params: SGLang sampling parameters for this sample.

    **Example:**

    .. code-block:: python

        from rlsdk import CustomGenerate, hookimpl, single_turn

        async def twice(args, sample, sampling_params):
            sample = await single_turn(args, sample, sampling_params)
            sample.metadata["attempts"] = 1
            return sample

        @hookimpl
        def rlsdk_custom_generates():
            yield CustomGenerate(name="twice", func=twice, description="Single turn, tagged")
    """


# -------------------------------------------------------------------------
# Rewards
# -------------------------------------------------------------------------


@hookspec
def rlsdk_rewards() -> Iterable[Reward]:
    """Provide reward functions.

    The callable is ``reward(args, sample, **kwargs) -> float | dict | None`` (sync or async). With
    ``group=True`` it is ``reward(args, samples, **kwargs) -> list`` and is called once per group.
    ``None`` marks the sample's reward invalid; it is never read as 0.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param sample: the :class:`rlsdk.Sample` to score (``samples`` for group rewards).

    **Example:**

    .. code-block:: python

        from rlsdk import Reward, hookimpl

        def exact(args, sample, **kwargs):
            return float(sample.response.strip() == str(sample.label).strip())

        @hookimpl
        def rlsdk_rewards():
            yield Reward(name="exact", func=exact, description="1 if the response equals the label")
    """


# -------------------------------------------------------------------------
# Filters
# -------------------------------------------------------------------------


@hookspec
def rlsdk_dynamic_filters() -> Iterable[DynamicFilter]:
    """Provide dynamic filters, applied to each finished group during a step.

    The callable is ``dynamic_filter(args, samples, **kwargs) -> DynamicFilterOutput | bool``; a
    dropped group counts under its ``reason`` in the step's metrics.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param samples: one group, all samples of one prompt, rewarded.

    **Example:**

    .. code-block:: python

        from rlsdk import DynamicFilter, DynamicFilterOutput, hookimpl

        def any_correct(args, samples, **kwargs):
            ok = any(s.get_reward_value(args) for s in samples)
            return DynamicFilterOutput(keep=ok, reason=None if ok else "all_wrong")

        @hookimpl
        def rlsdk_dynamic_filters():
            yield DynamicFilter(name="any_correct", func=any_correct)
    """


@hookspec
def rlsdk_over_sampling_filters() -> Iterable[OverSamplingFilter]:
    """Provide over-sampling filters, which order the kept groups before the batch is cut.

    The callable is ``over_sampling_filter(args, groups, **kwargs) -> groups``; the loop keeps the
    first ``rollout_batch_size`` groups of the result and returns the rest to the buffer.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param groups: the kept groups.

    **Example:**

    .. code-block:: python

        from rlsdk import OverSamplingFilter, hookimpl

        def longest_first(args, groups, **kwargs):
            return sorted(groups, key=lambda g: -sum(s.response_length for s in g))

        @hookimpl
        def rlsdk_over_sampling_filters():
            yield OverSamplingFilter(name="longest_first", func=longest_first)
    """


@hookspec
def rlsdk_buffer_filters() -> Iterable[BufferFilter]:
    """Provide buffer filters, which choose the buffered groups served before fresh data.

    The callable is ``buffer_filter(args, rollout_id, buffer, num_samples) -> groups``: it returns at
    most ``num_samples`` groups and removes them from ``buffer`` (a list it may mutate).

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param rollout_id: the current step.
    :param buffer: the buffered groups, oldest first.
    :param num_samples: how many groups are wanted.

    **Example:**

    .. code-block:: python

        from rlsdk import BufferFilter, hookimpl

        def newest_first(args, rollout_id, buffer, num_samples):
            taken = buffer[-num_samples:] if num_samples else []
            del buffer[len(buffer) - len(taken):]
            return taken[::-1]

        @hookimpl
        def rlsdk_buffer_filters():
            yield BufferFilter(name="newest_first", func=newest_first)
    """


# -------------------------------------------------------------------------
# Engines
# -------------------------------------------------------------------------


@hookspec
def rlsdk_engines() -> Iterable[Engine]:
    """Provide inference engines speaking SGLang's native protocol.

    The callable is a factory ``engine(args) -> rlsdk.engines.engine.InferenceEngine``; it may set
    ``args.sglang_router_ip``/``args.sglang_router_port`` when the engine serves HTTP.

    :param args: the run's :class:`rlsdk.RolloutConfig`.

    **Example:**

    .. code-block:: python

        from rlsdk import Engine, hookimpl
        from rlsdk import SGLangClient

        def my_cluster(args):
            return SGLangClient("http://10.0.0.5:30000")

        @hookimpl
        def rlsdk_engines():
            yield Engine(name="my_cluster", func=my_cluster, description="Our shared SGLang router")
    """


# -------------------------------------------------------------------------
# Agents: tools and rollout-buffer tasks
# -------------------------------------------------------------------------


@hookspec
def rlsdk_tools() -> Iterable[Tool]:
    """Provide tools that multi-turn generators (``multi_turn``, agents) may call by name.

    The callable is ``tool(args, **arguments) -> str`` (sync or async); its result is appended to the
    sample as an observation with loss mask 0. A tool that raises or runs past the record's
    ``timeout`` gives an observation with the error instead.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param arguments: the call's arguments, matching the record's ``parameters`` JSON schema.

    **Example:**

    .. code-block:: python

        from rlsdk import Tool, hookimpl

        def word_count(args, text):
            return str(len(text.split()))

        @hookimpl
        def rlsdk_tools():
            yield Tool(
                name="word_count",
                func=word_count,
                description="Count the words of a text",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                timeout=5.0,
            )
    """


@hookspec
def rlsdk_task_generators() -> Iterable[TaskGenerator]:
    """Provide rollout-buffer tasks: agents that produce trajectories outside the trainer.

    The callable is slime's ``run_rollout(data)``: ``rlsdk buffer serve`` runs it in a worker thread
    when a trainer posts ``/start_rollout`` with ``"task_type": <name>``; it posts each finished
    trajectory (``instance_id``, ``uid``, ``messages``, ``reward``, ``extra_info``) to
    ``data["remote_buffer_url"] + "/buffer/write"``. A slime generator module registers unchanged with
    :meth:`rlsdk.TaskGenerator.from_module`.

    :param data: the ``/start_rollout`` body: ``task_type``, ``input_file``, ``num_repeat_per_sample``,
        ``remote_engine_url``, ``remote_buffer_url``, ``sampling_params``, ...

    **Example:**

    .. code-block:: python

        import json
        import httpx
        from rlsdk import TaskGenerator, hookimpl

        def run_rollout(data):
            with open(data["input_file"]) as rows:
                for line_no, line in enumerate(rows):
                    row = json.loads(line)
                    for i in range(int(data["num_repeat_per_sample"])):
                        messages = [{"role": "user", "content": row["question"]},
                                    {"role": "assistant", "content": row["answer"]}]
                        httpx.post(data["remote_buffer_url"] + "/buffer/write", json={
                            "instance_id": str(line_no), "uid": f"{line_no}-{i}", "messages": messages,
                            "reward": 1.0, "extra_info": {},
                        })

        @hookimpl
        def rlsdk_task_generators():
            yield TaskGenerator(name="replay_answers", func=run_rollout, description="Replay reference answers")
    """


@hookspec
def rlsdk_tool_call_parsers() -> Iterable[ToolCallParser]:
    """Provide tool-call parsers for ``/v1/chat/completions`` (``--tool-call-parser NAME``).

    The callable is ``parse(text, tools) -> rlsdk.agents.ParsedTurn``: the content and the function calls
    (``name``, ``arguments`` as a dict) of one model turn. The record's ``format_calls`` and
    ``tools_prompt`` write calls and tool definitions in the model's format for chat templates that render
    neither.

    :param text: the turn's text, special tokens skipped.
    :param tools: the request's ``tools``, OpenAI function definitions.

    **Example:**

    .. code-block:: python

        import json
        from rlsdk import ToolCallParser, hookimpl
        from rlsdk import FunctionCall, ParsedTurn

        def call_lines(text, tools):
            lines = text.splitlines()
            calls = [FunctionCall(**json.loads(line[5:])) for line in lines if line.startswith("CALL ")]
            return ParsedTurn(" ".join(line for line in lines if not line.startswith("CALL ")), calls)

        def write_calls(calls):
            return "\\n".join("CALL " + json.dumps({"name": c.name, "arguments": c.arguments}) for c in calls)

        @hookimpl
        def rlsdk_tool_call_parsers():
            yield ToolCallParser(name="call_lines", func=call_lines, marker="CALL ", format_calls=write_calls)
    """


@hookspec
def rlsdk_agents() -> Iterable[Agent]:
    """Provide agents for the ``openai_agent`` and ``anthropic_agent`` custom_generates
    (``--set agent_function_path=NAME``).

    The callable is ``agent(args, sample, client) -> result`` (sync or async) and talks to the model only
    through ``client``: an ``openai.AsyncOpenAI`` (``anthropic.AsyncAnthropic`` under ``anthropic_agent``)
    for async agents, the sync client for sync ones, bound to the sample's session, which records every
    turn's tokens. The result (JSON-ready) and the
    transcript land in ``sample.metadata["agent"]`` for rewards.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param sample: the :class:`rlsdk.Sample` (its ``prompt``, ``label`` and ``metadata``).
    :param client: the OpenAI client bound to the sample's session.

    **Example:**

    .. code-block:: python

        from rlsdk import Agent, hookimpl

        async def ask_twice(args, sample, client):
            messages = [{"role": "user", "content": sample.prompt}]
            first = await client.chat.completions.create(model="policy", messages=messages)
            messages += [first.choices[0].message, {"role": "user", "content": "Are you sure?"}]
            second = await client.chat.completions.create(model="policy", messages=messages)
            return second.choices[0].message.content

        @hookimpl
        def rlsdk_agents():
            yield Agent(name="ask_twice", func=ask_twice, description="Answer, then reconsider")
    """


# -------------------------------------------------------------------------
# Training: trainers and losses
# -------------------------------------------------------------------------


@hookspec
def rlsdk_trainers() -> Iterable[Trainer]:
    """Provide policy trainers for ``rlsdk run --train`` (``--trainer NAME``).

    The callable is a factory ``trainer(args) -> rlsdk.PolicyTrainer``: an object that trains on a
    step's kept samples, reports per-token log-probs for the trust check, hands its weights to the
    engine and saves and loads checkpoints. Heavy imports (torch, megatron) belong inside the factory.

    :param args: the run's :class:`rlsdk.RolloutConfig` (slime's training option names: ``lr``,
        ``global_batch_size``, ``micro_batch_size``, ``eps_clip``, ...).

    **Example:**

    .. code-block:: python

        from rlsdk import Trainer, hookimpl

        def frozen_embeddings(args):
            from rlsdk import TorchTrainer

            trainer = TorchTrainer(args)
            trainer.model.get_input_embeddings().requires_grad_(False)
            return trainer

        @hookimpl
        def rlsdk_trainers():
            yield Trainer(name="frozen_embeddings", func=frozen_embeddings,
                          description="The torch trainer with frozen input embeddings")
    """


@hookspec
def rlsdk_losses() -> Iterable[Loss]:
    """Provide losses for ``--loss-type custom_loss --custom-loss-function-path NAME``.

    The callable has slime's custom-loss signature ``loss(args, batch, logits, sum_of_sample_mean)``
    and returns ``(loss, metrics)``: a scalar tensor and a dict of detached scalar tensors.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param batch: one micro-batch as slime builds it: ``unconcat_tokens``, ``total_lengths``,
        ``response_lengths``, ``loss_masks``, ``advantages``, ``log_probs`` (before this step),
        ``rollout_log_probs``, ``ref_log_probs`` (with a KL term) and ``rewards``; lists with one
        tensor (or number) per sample.
    :param logits: the packed logits ``[1, sum(total_lengths), vocab]`` of the micro-batch's samples;
        for a record with ``logits="response"``, only the rows that predict response tokens,
        ``[1, sum(response_lengths), vocab]`` (less time and memory; ``log_probs_and_entropy`` and
        ``response_logits`` read either).
    :param sum_of_sample_mean: reduces a packed per-response-token tensor to the sum over samples of
        each sample's masked mean (or the masked token sum with ``--calculate-per-token-loss``).

    **Example:**

    .. code-block:: python

        from rlsdk import Loss, hookimpl
        from rlsdk import log_probs_and_entropy

        def reinforce(args, batch, logits, sum_of_sample_mean):
            import torch

            log_probs, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
            advantages = torch.cat(batch["advantages"])
            loss = sum_of_sample_mean(-advantages * torch.cat(log_probs))
            return loss, {"loss": loss.detach()}

        @hookimpl
        def rlsdk_losses():
            yield Loss(name="reinforce", func=reinforce, logits="response", description="Plain REINFORCE")
    """


# -------------------------------------------------------------------------
# Samples, data and logging
# -------------------------------------------------------------------------


@hookspec
def rlsdk_sample_hooks() -> Iterable[SampleHook]:
    """Provide sample hooks, applied to every generated sample before its reward (``--sample-hook NAME``,
    slime's ``--rollout-sample-hook-path``; several run in the order given).

    The callable is ``hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`` (sync or
    async); ``rollout_id`` and ``evaluation`` are passed only when it declares them. It returns the sample
    to go on with, or None to keep the one it was given (edited in place, say).

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param sample: one finished :class:`rlsdk.Sample`.

    **Example:**

    .. code-block:: python

        from rlsdk import SampleHook, hookimpl

        def strip_think(args, sample, *, rollout_id=None, evaluation=False):
            sample.response = sample.response.split("</think>")[-1]

        @hookimpl
        def rlsdk_sample_hooks():
            yield SampleHook(name="strip_think", func=strip_think, description="Grade the text after </think>")
    """


@hookspec
def rlsdk_rollout_sample_filters() -> Iterable[RolloutSampleFilter]:
    """Provide sample filters, applied to a step's kept groups (``--rollout-sample-filter-path NAME``).

    The callable is slime's ``sample_filter(args, groups) -> None``: it sets ``remove_sample = True`` on the
    samples to leave out of the loss (their loss mask becomes 0; they still count in their group's reward
    normalization).

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param groups: the step's kept groups.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutSampleFilter, hookimpl

        def drop_truncated(args, groups):
            for group in groups:
                for sample in group:
                    sample.remove_sample = sample.status == sample.Status.TRUNCATED

        @hookimpl
        def rlsdk_rollout_sample_filters():
            yield RolloutSampleFilter(name="drop_truncated", func=drop_truncated)
    """


@hookspec
def rlsdk_all_samples_processes() -> Iterable[AllSamplesProcess]:
    """Provide processors of every group a step finished, kept and dropped alike
    (``--rollout-all-samples-process-path NAME``), called once at the end of each step.

    The callable is slime's ``process(args, all_groups, data_source) -> None``.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param all_groups: the step's kept and discarded groups, by group index.
    :param data_source: the run's data source.

    **Example:**

    .. code-block:: python

        import json
        from rlsdk import AllSamplesProcess, hookimpl

        def dump_all(args, all_groups, data_source):
            with open(f"{args.output_dir}/all_groups.jsonl", "a") as out:
                for group in all_groups:
                    out.write(json.dumps([s.reward for s in group], default=str) + "\\n")

        @hookimpl
        def rlsdk_all_samples_processes():
            yield AllSamplesProcess(name="dump_all", func=dump_all)
    """


@hookspec
def rlsdk_data_sources() -> Iterable[DataSourceFactory]:
    """Provide data sources, the objects that serve a run's groups (``--data-source NAME``, slime's
    ``--data-source-path``).

    The callable is a class or factory ``data_source(args)`` whose result has slime's methods
    ``get_samples(num_samples) -> list[list[Sample]]`` and ``add_samples(groups)``; with ``state_dict()`` and
    ``load_state_dict(state)`` a run resumes where it stopped.

    :param args: the run's :class:`rlsdk.RolloutConfig`.

    **Example:**

    .. code-block:: python

        from rlsdk import DataSourceFactory, Sample, hookimpl

        class Countdown:
            def __init__(self, args):
                self.args, self.next = args, 0
                self.buffer = []

            def get_samples(self, num_samples, rollout_id=None):
                groups = []
                for _ in range(num_samples):
                    self.next += 1
                    prompt = f"What is {self.next} + 1?"
                    groups.append([Sample(prompt=prompt, label=str(self.next + 1), group_index=self.next)
                                   for _ in range(self.args.n_samples_per_prompt)])
                return groups

            def add_samples(self, groups, rollout_id=None):
                self.buffer.extend(groups)

        @hookimpl
        def rlsdk_data_sources():
            yield DataSourceFactory(name="countdown", func=Countdown, description="Endless additions")
    """


@hookspec
def rlsdk_rollout_logs() -> Iterable[RolloutLog]:
    """Provide logging backends for each step (``--rollout-log a,b``, slime's
    ``--custom-rollout-log-function-path``; ``jsonl``, ``tensorboard`` and ``wandb`` ship with core).

    The callable is ``log(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool``.

    :param rollout_id: the step.
    :param args: the run's :class:`rlsdk.RolloutConfig` (``args.output_dir`` is the run's folder).
    :param samples: the step's kept samples, flat.
    :param rollout_extra_metrics: the step's metrics (``rollout/...``, ``train/...``).
    :param rollout_time: the step's rollout seconds.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutLog, hookimpl

        def print_reward(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
            print(rollout_id, rollout_extra_metrics.get("rollout/reward_mean"))
            return False

        @hookimpl
        def rlsdk_rollout_logs():
            yield RolloutLog(name="print_reward", func=print_reward)
    """


@hookspec
def rlsdk_eval_rollout_logs() -> Iterable[EvalRolloutLog]:
    """Provide logging backends for each eval (``--eval-rollout-log a,b``, slime's
    ``--custom-eval-rollout-log-function-path``).

    The callable is ``log(rollout_id, args, data, extra_metrics) -> bool``.

    :param rollout_id: the step the eval follows (-1 before the first).
    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param data: ``{dataset: {"rewards", "truncated", "samples"}}``.
    :param extra_metrics: the eval's metrics (``eval/<dataset>/...``).

    **Example:**

    .. code-block:: python

        from rlsdk import EvalRolloutLog, hookimpl

        def print_eval(rollout_id, args, data, extra_metrics):
            for name, part in data.items():
                print(rollout_id, name, sum(r or 0 for r in part["rewards"]) / len(part["rewards"]))
            return False

        @hookimpl
        def rlsdk_eval_rollout_logs():
            yield EvalRolloutLog(name="print_eval", func=print_eval)
    """


@hookspec
def rlsdk_checkpoint_callbacks() -> Iterable[CheckpointCallback]:
    """Provide callbacks run after each checkpoint is complete (``--checkpoint-callback a,b``), as verl's
    ``checkpoint_callback_class``: the folder is in place and the run's state points at it.

    The callable is ``callback(args, rollout_id, path) -> None``.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param rollout_id: the step the checkpoint follows.
    :param path: the checkpoint's folder (``step_<rollout_id>``, a Hugging Face model inside).

    **Example:**

    .. code-block:: python

        import shutil
        from rlsdk import CheckpointCallback, hookimpl

        def keep_copy(args, rollout_id, path):
            shutil.copytree(path, f"/backups/{path.name}", dirs_exist_ok=True)

        @hookimpl
        def rlsdk_checkpoint_callbacks():
            yield CheckpointCallback(name="keep_copy", func=keep_copy)
    """


@hookspec
def rlsdk_environments() -> Iterable[Environment]:
    """Provide environments: a task as one package (``rlsdk run --env NAME``, ``rlsdk eval --env NAME``).

    The callable is ``settings() -> dict``: the run options the environment sets (its dataset, label key
    and chat settings, its reward or rubric, its generator or agent, its eval sets, default options); an
    option on the command line wins over the environment's.

    **Example:**

    .. code-block:: python

        from rlsdk import Environment, hookimpl, package_file

        def settings():
            return {
                "prompt_data": package_file("my_env", "data/train.jsonl"),
                "label_key": "label",
                "apply_chat_template": True,
                "rm_type": "exact:0.8,has_number:0.2",
                "eval_datasets": [{"name": "held-out", "path": package_file("my_env", "data/eval.jsonl")}],
            }

        @hookimpl
        def rlsdk_environments():
            yield Environment(name="my_env", func=settings, description="Two-digit sums")
    """


# -------------------------------------------------------------------------
# Training: slime's trainer-side hooks
# -------------------------------------------------------------------------


@hookspec
def rlsdk_advantages() -> Iterable[Advantage]:
    """Provide advantage estimators (``--custom-advantage-function-path NAME``).

    The callable is slime's ``advantage(args, rollout_data) -> None``: it sets ``rollout_data["advantages"]``
    (one per-response-token tensor per sample; ``"returns"`` too, as slime's do) from ``rewards`` (after
    the reward post-processing), ``kl``, ``loss_masks``, ``response_lengths``, ``rollout_log_probs``.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param rollout_data: the step's training data, one entry per sample in each list.

    **Example:**

    .. code-block:: python

        from rlsdk import Advantage, hookimpl

        def sign_only(args, rollout_data):
            import torch

            rollout_data["advantages"] = [
                torch.full_like(mask, float(reward > 0) - float(reward < 0), dtype=torch.float32)
                for reward, mask in zip(rollout_data["rewards"], rollout_data["loss_masks"])
            ]
            rollout_data["returns"] = rollout_data["advantages"]

        @hookimpl
        def rlsdk_advantages():
            yield Advantage(name="sign_only", func=sign_only, description="+1, 0 or -1 per sample")
    """


@hookspec
def rlsdk_reward_post_processes() -> Iterable[RewardPostProcess]:
    """Provide reward post-processing (``--custom-reward-post-process-path NAME``), in place of the group
    normalization of the group estimators.

    The callable is slime's ``post_process(args, samples) -> (raw_rewards, rewards)``: two lists of floats,
    one per sample; ``rewards`` become the advantages' source.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param samples: the step's kept samples, flat, group by group.

    **Example:**

    .. code-block:: python

        from rlsdk import RewardPostProcess, hookimpl

        def centered(args, samples):
            raw = [s.get_reward_value(args) for s in samples]
            mean = sum(raw) / len(raw)
            return raw, [r - mean for r in raw]

        @hookimpl
        def rlsdk_reward_post_processes():
            yield RewardPostProcess(name="batch_centered", func=centered)
    """


@hookspec
def rlsdk_rollout_data_postprocesses() -> Iterable[RolloutDataPostprocess]:
    """Provide training-data post-processing (``--rollout-data-postprocess-path NAME``), called once the
    step's data holds its log-probs, before advantages.

    The callable is slime's ``postprocess(args, rollout_id, rollout_data) -> None``; it edits
    ``rollout_data`` in place (``loss_masks``, ``rewards``, ...).

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param rollout_id: the step.
    :param rollout_data: the step's training data, one entry per sample in each list.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutDataPostprocess, hookimpl

        def mask_truncated(args, rollout_id, rollout_data):
            for mask, truncated in zip(rollout_data["loss_masks"], rollout_data["truncated"]):
                if truncated:
                    mask.zero_()

        @hookimpl
        def rlsdk_rollout_data_postprocesses():
            yield RolloutDataPostprocess(name="mask_truncated", func=mask_truncated)
    """


@hookspec
def rlsdk_train_data_converters() -> Iterable[ConvertSamplesToTrainData]:
    """Provide converters of a step's samples to slime's training-data dict
    (``--custom-convert-samples-to-train-data-path NAME``): for slime's own trainer through
    ``rlsdk.slime.convert_samples_to_train_data.<name>``, and for trainers that read that dict.

    The callable is slime's ``convert(args, samples) -> dict`` with at least ``tokens``, ``response_lengths``,
    ``rewards``, ``raw_reward``, ``truncated``, ``sample_indices`` and ``loss_masks``.

    :param args: the run's :class:`rlsdk.RolloutConfig`.
    :param samples: the step's kept samples, flat.

    **Example:**

    .. code-block:: python

        from rlsdk import ConvertSamplesToTrainData, hookimpl

        def plain(args, samples):
            return {
                "tokens": [s.tokens for s in samples],
                "response_lengths": [s.response_length for s in samples],
                "rewards": [s.get_reward_value(args) for s in samples],
                "raw_reward": [s.get_reward_value(args) for s in samples],
                "truncated": [int(s.status == s.Status.TRUNCATED) for s in samples],
                "sample_indices": [s.index for s in samples],
                "loss_masks": [s.loss_mask or [1] * s.response_length for s in samples],
            }

        @hookimpl
        def rlsdk_train_data_converters():
            yield ConvertSamplesToTrainData(name="plain", func=plain)
    """


@hookspec
def rlsdk_pg_loss_reducers() -> Iterable[PgLossReducer]:
    """Provide reducers of the per-token policy-gradient loss (``--custom-pg-loss-reducer-function-path NAME``);
    the loss's other terms keep ``sum_of_sample_mean``.

    The callable is slime's ``reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)``
    and returns ``reduce(x) -> scalar`` for a packed per-response-token tensor ``x``.

    :param total_lengths: prompt plus response tokens per sample.
    :param response_lengths: response tokens per sample.
    :param loss_masks: one 0/1 tensor per sample.
    :param calculate_per_token_loss: ``args.calculate_per_token_loss``.

    **Example:**

    .. code-block:: python

        from rlsdk import PgLossReducer, hookimpl

        def token_sum(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
            import torch

            mask = torch.cat(loss_masks)
            return lambda x: (x * mask).sum()

        @hookimpl
        def rlsdk_pg_loss_reducers():
            yield PgLossReducer(name="token_sum", func=token_sum)
    """


@hookspec
def rlsdk_tis_functions() -> Iterable[TisFunction]:
    """Provide truncated-importance-sampling functions for ``--use-tis`` (``--custom-tis-function-path NAME``).

    The callable is slime's, called by keyword: ``tis(*, args, pg_loss, train_log_probs, rollout_log_probs,
    loss_masks, total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics)``: the weighted per-token
    loss, the loss masks to reduce it with (rejected tokens zeroed) and a dict of per-token tensors to report.

    :param pg_loss: the packed per-response-token policy-gradient loss.
    :param train_log_probs: the trainer's log-probs, one tensor per sample.
    :param rollout_log_probs: the engine's log-probs, one tensor per sample.

    **Example:**

    .. code-block:: python

        from rlsdk import TisFunction, hookimpl

        def clipped(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                    response_lengths):
            import torch

            ratio = (torch.cat(train_log_probs) - torch.cat(rollout_log_probs)).exp().clamp(max=args.tis_clip)
            return pg_loss * ratio.detach(), loss_masks, {"tis": ratio.detach()}

        @hookimpl
        def rlsdk_tis_functions():
            yield TisFunction(name="clipped", func=clipped)
    """


# -------------------------------------------------------------------------
# The megatron trainer's hooks and the weight sync's
# -------------------------------------------------------------------------


@hookspec
def rlsdk_megatron_inits() -> Iterable[MegatronInit]:
    """Provide functions the ``megatron`` trainer calls once on every rank after megatron's parallel state is
    initialised, before it builds the model (``--custom-megatron-init-path NAME``).

    The callable is slime's ``init(args) -> None``.

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronInit, hookimpl

        def deterministic(args):
            import torch

            torch.backends.cudnn.deterministic = True

        @hookimpl
        def rlsdk_megatron_inits():
            yield MegatronInit(name="deterministic", func=deterministic)
    """


@hookspec
def rlsdk_megatron_before_log_probs() -> Iterable[MegatronBeforeLogProb]:
    """Provide hooks the ``megatron`` trainer calls before each log-prob computation
    (``--custom-megatron-before-log-prob-hook-path NAME``).

    The callable is slime's ``hook(args, model, store_prefix) -> None``.

    :param model: the trainer's model chunks (a list of one ``GPTModel``).
    :param store_prefix: ``""`` for the policy's log-probs, ``"ref_"`` for the reference model's.

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronBeforeLogProb, hookimpl

        def eval_mode(args, model, store_prefix):
            for chunk in model:
                chunk.eval()

        @hookimpl
        def rlsdk_megatron_before_log_probs():
            yield MegatronBeforeLogProb(name="eval_mode", func=eval_mode)
    """


@hookspec
def rlsdk_megatron_before_train_steps() -> Iterable[MegatronBeforeTrainStep]:
    """Provide hooks the ``megatron`` trainer calls before each optimizer step's passes, gradients zeroed
    (``--custom-megatron-before-train-step-hook-path NAME``).

    The callable is slime's ``hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None``.

    :param step_id: the optimizer step within the rollout step, from 0.
    :param model: the trainer's model chunks (a list of one ``GPTModel``).
    :param opt_param_scheduler: ``None`` (rlsdk keeps the learning rate constant).

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronBeforeTrainStep, hookimpl

        def warmup(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (rollout_id + 1) / 10)

        @hookimpl
        def rlsdk_megatron_before_train_steps():
            yield MegatronBeforeTrainStep(name="warmup", func=warmup)
    """


@hookspec
def rlsdk_model_providers() -> Iterable[ModelProvider]:
    """Provide model builders for the ``megatron`` trainer, in place of its ``GPTModel``
    (``--custom-model-provider-path NAME``).

    The callable is slime's ``provider(pre_process, post_process, vp_stage=None) -> GPTModel``, called by
    keyword; the checkpoint's converted weights are loaded into what it returns, so the weights keep
    ``GPTModel``'s names. Declare ``config=None`` and ``model_kwargs=None`` to get the ``TransformerConfig``
    and the other ``GPTModel`` arguments the trainer would use.

    **Example:**

    .. code-block:: python

        from rlsdk import ModelProvider, hookimpl

        def local_spec(pre_process, post_process, vp_stage=None, config=None, model_kwargs=None):
            from megatron.core.models.gpt import GPTModel
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

            spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
            return GPTModel(config=config, transformer_layer_spec=spec, pre_process=pre_process,
                            post_process=post_process, **model_kwargs)

        @hookimpl
        def rlsdk_model_providers():
            yield ModelProvider(name="local_spec", func=local_spec)
    """


@hookspec
def rlsdk_update_weight_post_writes() -> Iterable[UpdateWeightPostWrite]:
    """Provide hooks called after a disk weight sync (``--weight-sync disk``) wrote a version's files and
    before the engines read them (``--custom-update-weight-post-write-path NAME``).

    The callable is slime's ``hook(args, version_dir, rollout_engines) -> None``.

    :param version_dir: the folder just written (a string).
    :param rollout_engines: the engines about to read it (:class:`rlsdk.InferenceEngine` objects).

    **Example:**

    .. code-block:: python

        from rlsdk import UpdateWeightPostWrite, hookimpl

        def publish(args, version_dir, rollout_engines):
            import subprocess

            subprocess.run(["sync", "-f", version_dir], check=True)

        @hookimpl
        def rlsdk_update_weight_post_writes():
            yield UpdateWeightPostWrite(name="publish", func=publish)
    """


# -------------------------------------------------------------------------
# Options
# -------------------------------------------------------------------------


@hookspec
def rlsdk_options() -> Iterable[Option]:
    """Declare the run options this plugin reads from ``args``: ``rlsdk run --help`` and ``rlsdk plugins show``
    list them, and a config file, ``--set`` or a flag with a wrong type or a misspelled key is an error.
    ``args.<name>`` reads the option's default when the run does not set it.

    **Example:**

    .. code-block:: python

        from rlsdk import Option, hookimpl

        @hookimpl
        def rlsdk_options():
            yield Option(name="retriever_url", type=str, help="URL of the retrieval server")
            yield Option(name="retriever_topk", type=int, default=3, help="Passages per search")
    """
