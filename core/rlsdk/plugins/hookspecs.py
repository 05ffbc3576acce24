"""Hook specifications: one provider hook per kind of plugin.

Each hook returns (or yields) records with a name; the plugin manager collects them into one table
per kind and the engine loop resolves implementations by name. Pluggy is used for discovery only:
the loop calls the resolved callables directly.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from .records import (
    Agent,
    BufferFilter,
    CustomGenerate,
    DynamicFilter,
    Engine,
    GenerateRollout,
    Loss,
    Option,
    OverSamplingFilter,
    Reward,
    TaskGenerator,
    Tool,
    ToolCallParser,
    Trainer,
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
