"""Prompts with images against the real text-only model: ``rlsdk serve`` answers 400 saying the model
cannot take images, the rollout loop records the sample as failed with that message, and ``rlsdk run``
stops before generating."""

from __future__ import annotations

import json

import httpx
import pytest

import rlsdk_filter_hub.plugin
from rlsdk import Reward, RolloutConfig, Sample, hookimpl
from rlsdk import DataSource
from rlsdk.engine_api import SGLangClient
from rlsdk import DataError
from rlsdk import run_job
from rlsdk import Runtime
from rlsdk.testing import bind_runtime
from rlsdk_generators import plugin as generators_plugin

pytestmark = pytest.mark.slow

CANNOT = "cannot take images (it has no image understanding)"


class Zero:
    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="zero", func=lambda args, sample, **kwargs: 0.0)


@pytest.fixture
def image_data(tmp_path):
    path = tmp_path / "images.jsonl"
    row = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    {"type": "text", "text": "What animal is this?"},
                ],
            }
        ],
        "label": "cat",
    }
    path.write_text(json.dumps(row) + "\n")
    return path


def test_rlsdk_serve_answers_image_requests_with_400(served):
    body = {
        "text": "What is in the picture?",
        "image_data": ["https://example.com/cat.png"],
        "sampling_params": {"max_new_tokens": 4},
    }
    response = httpx.post(served.url + "/generate", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()
    assert error["object"] == "error" and error["code"] == 400 and CANNOT in error["message"]


def test_loop_records_an_image_sample_as_failed(rlsdk_pm, served, image_data):
    for plugin in (generators_plugin, rlsdk_filter_hub.plugin, Zero()):
        rlsdk_pm.register(plugin)
    args = RolloutConfig(
        prompt_data=str(image_data),
        label_key="label",
        apply_chat_template=True,
        rm_type="zero",
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        rollout_max_groups_per_step=1,
        rollout_max_response_len=8,
    )
    tokenizer = served.engine.tokenizer
    data = DataSource(args, pm=rlsdk_pm, tokenizer=tokenizer)
    runtime = bind_runtime(args, Runtime(rlsdk_pm, SGLangClient(served.url), tokenizer))
    try:
        output = rlsdk_pm.resolve("generate_rollout", "sglang").func(args, 0, data)
    finally:
        runtime.loop.close()
    assert output.samples == [] and output.metrics["ledger/failed"] == 2
    (group,) = output.discarded
    for sample in group:
        assert sample.status == Sample.Status.FAILED and CANNOT in sample.metadata["generate_error"]
        assert sample.multimodal_inputs == {"images": ["https://example.com/cat.png"]}


def test_rlsdk_run_stops_before_generating(served, image_data, tmp_path):
    args = RolloutConfig(
        engine=served.url,
        hf_checkpoint=str(served.engine.model_path),
        prompt_data=str(image_data),
        label_key="label",
        apply_chat_template=True,
        output_dir=str(tmp_path / "out"),
    )
    with pytest.raises(
        DataError, match=r"images.jsonl has prompts with images, but the engine's model .* cannot take images"
    ):
        run_job(args)
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()
