"""Plain functions with slime's signatures, as a slime user already has them: no rlsdk imports.

The generator posts to the engine's ``/generate`` itself, as slime's custom generators do."""

import httpx


async def generate(args, sample, sampling_params, evaluation=False):
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    body = {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True}
    async with httpx.AsyncClient(timeout=300) as client:
        response = await client.post(url, json=body)
        response.raise_for_status()
        output = response.json()
    logprobs = output["meta_info"]["output_token_logprobs"]
    sample.tokens = sample.tokens + [t for _, t, _ in logprobs]
    sample.rollout_log_probs = [lp for lp, _, _ in logprobs]
    sample.response_length = len(logprobs)
    sample.response = output["text"]
    sample.loss_mask = [1] * len(logprobs)
    finish = output["meta_info"]["finish_reason"]["type"]
    sample.status = {"stop": sample.Status.COMPLETED, "length": sample.Status.TRUNCATED}.get(
        finish, sample.Status.ABORTED)
    sample.metadata["slime_style"] = True
    sample.metadata["hf_checkpoint"] = args.hf_checkpoint  # where slime's functions load the tokenizer from
    return sample


async def reward(args, sample, **kwargs):
    return {"score": float(len(sample.response) % 2), "length": len(sample.response)}


def keep_all(args, samples, **kwargs):
    return True


def newest_first(args, rollout_id, buffer, num_samples):
    taken = buffer[-num_samples:] if num_samples else []
    del buffer[len(buffer) - len(taken):]
    return taken
