"""rlsdk's generators and rollout handed to slime by name (``rlsdk.slime.<kind>.<name>``), called as slime
calls them, against ``rlsdk serve`` of the real small model. slime's ``args`` here carry only what slime's
would (the router address, the checkpoint, slime's rollout options): rlsdk's defaults answer the rest."""

from __future__ import annotations

import argparse
import asyncio
import importlib

import pytest

from rlsdk import Sample
from rlsdk import get_runtime
from rlsdk.slime import view

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served():
    """One served engine (the adapters do not depend on the decode mode the shared fixture varies)."""
    from rlsdk.testing import ServedEngine
    from rlsdk_embedded import EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as engine:
        yield engine


def load_function(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def slime_args(served, **options) -> argparse.Namespace:
    host, port = served.url.removeprefix("http://").split(":")
    return argparse.Namespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        hf_checkpoint=str(served.engine.model_path),
        partial_rollout=False,
        **options,
    )


def prompt_sample(served, index: int = 0) -> Sample:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    tokenizer = served.engine.tokenizer
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return Sample(
        index=index, prompt=messages, tokens=tokenizer(text, add_special_tokens=False)["input_ids"], label="4"
    )


@pytest.mark.parametrize("name", ["single_turn", "multi_turn"])
def test_custom_generators_inside_slime(served, name):
    generate = load_function(f"rlsdk.slime.custom_generate.{name}")
    args = slime_args(served)

    async def call():
        try:
            return await generate(args, prompt_sample(served), {"temperature": 0, "max_new_tokens": 6})
        finally:  # the client the adapter built for slime's args lives on this loop
            await get_runtime(view(args)).engine.close()

    out = asyncio.run(call())
    assert out.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and out.response
    assert out.response_length == len(out.rollout_log_probs) > 0


def test_sglang_rollout_inside_slime_with_slimes_data_source(served):
    """slime's data source takes ``get_samples(n)``; the rollout returns kept groups, rewarded."""

    class SlimeDataSource:
        def __init__(self):
            self.returned = []

        def get_samples(self, num_samples):
            return [[prompt_sample(served, i), prompt_sample(served, i)] for i in range(num_samples)]

        def add_samples(self, samples):
            self.returned += samples

    rollout = load_function("rlsdk.slime.generate_rollout.sglang")
    args = slime_args(
        served,
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        over_sampling_batch_size=1,
        rollout_max_response_len=6,
        rollout_temperature=1.0,
        rm_type="f1",
        reward_key=None,
    )
    try:
        output = rollout(args, None, SlimeDataSource(), evaluation=False)
    finally:
        runtime = get_runtime(view(args))
        runtime.run(runtime.engine.close())
        runtime.loop.close()
    [group] = output.samples
    assert len(group) == 2 and all(isinstance(s.reward, float) and s.response for s in group)
