"""A slime custom generator written the way slime's examples (search-r1, retool) are: slime's imports,
a sibling import, GenerateState's tokenizer, slime's ``post`` to ``/generate`` with text, slime's form of
``append_response_tokens`` with ``meta_info``, tool output with loss mask 0, slime's ``Sample.Status``,
and ``deepcopy(args)``. No rlsdk imports: under ``rlsdk run`` without slime, rlsdk stands in."""

from copy import deepcopy

from tool_reward import score_answer

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

TOOL_OUTPUT = "\n<tool>ok</tool>\n"


async def generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    assert deepcopy(args).hf_checkpoint == args.hf_checkpoint and args.sglang_dp_size == 1
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt = sample.prompt if isinstance(sample.prompt, str) else state.tokenizer.apply_chat_template(
        sample.prompt, tokenize=False, add_generation_prompt=True)
    sample.tokens = state.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response = ""
    for turn in range(2):
        output = await post(url, {"text": prompt + response, "sampling_params": sampling_params,
                                  "return_logprob": True})
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                      trainable=True, text=output["text"], meta_info=output["meta_info"])
        response += output["text"]
        if turn == 0:
            tool_ids = state.tokenizer(TOOL_OUTPUT, add_special_tokens=False)["input_ids"]
            sample.append_response_tokens(args, tokens=tool_ids, trainable=False, text=TOOL_OUTPUT)
            response += TOOL_OUTPUT
    sample.metadata["turns"] = 2
    return sample


async def reward_func(args, sample: Sample, **kwargs):
    return score_answer(sample.response, sample.label)
