"""Single-turn generation through an engine's SGLang ``/generate`` endpoint."""

from __future__ import annotations

from typing import Any

from rlsdk import Sample

_STATUS = {"stop": Sample.Status.COMPLETED, "length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED}


async def single_turn(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Complete ``sample.tokens`` with one ``/generate`` call; tokens and log-probs come from the engine."""
    from rlsdk.engine import SGLangClient

    client = SGLangClient.shared(f"http://{args.sglang_router_ip}:{args.sglang_router_port}")
    payload = {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True}
    output = await client.generate(payload)
    meta = output["meta_info"]
    new_tokens = [entry[1] for entry in meta["output_token_logprobs"]]
    sample.append_response_tokens(new_tokens, [entry[0] for entry in meta["output_token_logprobs"]])
    sample.response += output["text"]
    sample.weight_versions.append(str(meta.get("weight_version", "default")))
    sample.status = _STATUS[meta["finish_reason"]["type"]]
    return sample
