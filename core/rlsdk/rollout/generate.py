"""Single-turn generation: one ``/generate`` call through the run's engine.

Custom generators call :func:`generate` for model turns, and :func:`sampling_params_for` builds
SGLang sampling parameters from ``args``. Token ids and log-probs always come from the engine's
``output_token_logprobs``; model output is never re-tokenized.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from ..engines.protocol import EngineError
from ..runtime import get_runtime
from ..types import Sample
from ..config import RolloutConfig

_LOG_PROB, _TOKEN_ID = itemgetter(0), itemgetter(1)  # of an output_token_logprobs entry
FINISH_STATUS = {
    "stop": Sample.Status.COMPLETED,
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
}


def sampling_params_for(args: RolloutConfig, *, evaluation: bool = False) -> dict[str, Any]:
    """SGLang sampling parameters from the run configuration (eval overrides when ``evaluation``)."""

    def pick(eval_name: str, name: str) -> Any:
        value = getattr(args, eval_name, None) if evaluation else None
        return getattr(args, name) if value is None else value

    params: dict[str, Any] = {
        "temperature": pick("eval_temperature", "rollout_temperature"),
        "top_p": pick("eval_top_p", "rollout_top_p"),
        "top_k": args.rollout_top_k,
        "max_new_tokens": pick("eval_max_response_len", "rollout_max_response_len"),
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def prompt_ids(args: RolloutConfig, sample: Sample) -> list[int]:
    """The sample's token ids, tokenizing its prompt with the run's tokenizer when they are empty."""
    if sample.tokens:
        return sample.tokens
    if not isinstance(sample.prompt, str):
        raise ValueError(
            f"sample {sample.group_index}/{sample.index}: chat-message prompts need --apply-chat-template"
        )
    tokenizer = get_runtime(args).tokenizer
    if tokenizer is None:
        raise RuntimeError("the run has no tokenizer to turn the prompt into token ids")
    sample.tokens = list(tokenizer(sample.prompt, add_special_tokens=False)["input_ids"])
    return sample.tokens


def engine_prompt(args: RolloutConfig, sample: Sample, input_ids: list[int]) -> dict[str, Any]:
    """The prompt part of a ``/generate`` body: ``input_ids``, or for a sample with images
    (``multimodal_inputs["images"]``) SGLang's ``text`` (prompt plus the response so far) and
    ``image_data``."""
    images = sample.multimodal_inputs and sample.multimodal_inputs.get("images")
    if not images:
        return {"input_ids": list(input_ids)}
    if not isinstance(sample.prompt, str):
        raise ValueError(
            f"sample {sample.group_index}/{sample.index}: prompts with images need --apply-chat-template"
        )
    text = sample.prompt
    if sample.response_length:
        text += get_runtime(args).tokenizer.decode(sample.tokens[-sample.response_length :])
    return {"text": text, "image_data": list(images)}


def remaining_budget(sample: Sample, sampling_params: dict[str, Any]) -> int:
    """New tokens still allowed: ``max_new_tokens`` less what a partial rollout already generated."""
    return int(sampling_params.get("max_new_tokens", 0)) - sample.response_length


def apply_output(
    sample: Sample, output: dict[str, Any] | list[dict[str, Any]], tokenizer: Any = None
) -> Sample:
    """Append one ``/generate`` response to the sample: tokens, log-probs, text, status. The text leaves
    out a stop token the turn ended on (``<|im_end|>``), as SGLang's text does by default, while the token
    ids keep it; a matched stop string stays (rlsdk asks for ``no_stop_trim``, as slime does, so
    multi-turn generators see the tag they stopped on)."""
    if isinstance(output, list):  # the engine's answer to a batch, which a single request never is
        raise EngineError(f"the engine answered one request with {len(output)} responses")
    meta = output["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    # it makes lists of them, the log-probs floats
    sample.append_response_tokens(map(int, map(_TOKEN_ID, entries)), map(_LOG_PROB, entries))
    finish = meta.get("finish_reason") or {"type": "abort"}
    sample.response += without_stop_token(output.get("text", ""), finish, tokenizer)
    sample.weight_versions.append(str(meta.get("weight_version", "default")))
    sample.status = FINISH_STATUS.get(finish["type"], Sample.Status.FAILED)
    if finish["type"] not in FINISH_STATUS:
        sample.metadata["generate_error"] = f"engine finish reason {finish!r}"
    return sample


def without_stop_token(text: str, finish: dict[str, Any], tokenizer: Any) -> str:
    """``text`` without the stop token (an id in ``finish["matched"]``) it ends on, where it ends on it."""
    matched = finish.get("matched")
    if finish.get("type") != "stop" or not isinstance(matched, int) or tokenizer is None:
        return text
    stop = tokenizer.decode([matched])
    return text[: -len(stop)] if stop and text.endswith(stop) else text


def turn_budget(args: RolloutConfig, sample: Sample, sampling_params: dict[str, Any]) -> int:
    """New tokens the next turn may add: what is left of ``max_new_tokens`` for the response and, when
    ``args.rollout_max_context_len`` is set, of the context for prompt plus response."""
    budget = remaining_budget(sample, sampling_params)
    context = getattr(args, "rollout_max_context_len", None)
    if context:
        budget = min(budget, context - len(sample.tokens))
    return budget


def turn_payload(
    args: RolloutConfig,
    sample: Sample,
    sampling_params: dict[str, Any],
    *,
    stop: list[str] | tuple[str, ...] = (),
) -> dict[str, Any] | None:
    """The ``/generate`` body continuing ``sample.tokens``, clamped to :func:`turn_budget` (extra ``stop``
    strings added); None, with the sample marked truncated, when no budget is left."""
    input_ids = prompt_ids(args, sample)
    budget = turn_budget(args, sample, sampling_params)
    if budget <= 0:
        sample.status = Sample.Status.TRUNCATED
        return None
    params = {**sampling_params, "max_new_tokens": budget}
    if stop:
        params["stop"] = list(dict.fromkeys([*(params.get("stop") or []), *stop]))
    payload = engine_prompt(args, sample, input_ids)
    payload["sampling_params"] = params
    payload["return_logprob"] = True
    return payload


async def model_turn(
    args: RolloutConfig,
    sample: Sample,
    sampling_params: dict[str, Any],
    *,
    stop: list[str] | tuple[str, ...] = (),
) -> str:
    """Continue ``sample.tokens`` with one engine call (see :func:`turn_payload`); returns the turn's text.
    With no budget left the sample is marked truncated."""
    payload = turn_payload(args, sample, sampling_params, stop=stop)
    if payload is None:
        return ""
    runtime = get_runtime(args)
    output = await runtime.engine.generate(payload)
    before = len(sample.response)
    apply_output(sample, output, runtime.tokenizer)
    return sample.response[before:]


def append_observation(
    args: RolloutConfig, sample: Sample, text: str, sampling_params: dict[str, Any]
) -> bool:
    """Append tool or environment text as response tokens with loss mask 0, cut to :func:`turn_budget`.
    Returns False, marking the sample truncated, when it did not fit."""
    tokenizer = get_runtime(args).tokenizer
    if tokenizer is None:
        raise RuntimeError("the run has no tokenizer to turn an observation into token ids")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    kept = ids[: max(turn_budget(args, sample, sampling_params), 0)]
    sample.append_response_tokens(kept, trainable=False)
    sample.response += text if len(kept) == len(ids) else tokenizer.decode(kept)
    if len(kept) < len(ids):
        sample.status = Sample.Status.TRUNCATED
        return False
    return True


async def generate(args: RolloutConfig, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Generate the sample's response in one engine call, resuming after earlier partial tokens."""
    payload = turn_payload(args, sample, sampling_params)  # model_turn's work, one coroutine less a sample
    if payload is not None:
        runtime = get_runtime(args)
        apply_output(sample, await runtime.engine.generate(payload), runtime.tokenizer)
    return sample
