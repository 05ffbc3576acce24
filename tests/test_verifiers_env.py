"""verifiers environments under rlsdk: a module exporting verifiers' ``load_environment`` (here
``tests/fixtures/verifiers_env/vf_tiny_sums.py``, written against verifiers' public API) runs with ``--env
MODULE``: its dataset, its rollout through rlsdk's OpenAI-compatible endpoint (the ``openai_agent`` generator),
its rubric as the reward with each reward function logged.

Needs the optional ``verifiers`` package (``pip install 'rlsdk[verifiers]'``); skipped without it. The engine is
a :class:`rlsdk.testing.FakeEngine` with SmolLM2's tokenizer (its chat template) served on loopback: the test
needs answers it controls (right and wrong sums), which the small model does not give reliably.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytestmark = pytest.mark.slow

from rlsdk import RolloutConfig, get_plugin_manager  # noqa: E402
from rlsdk.data import DataSource  # noqa: E402
from rlsdk.rollout.step import rollout_step  # noqa: E402
from rlsdk.runtime import Runtime, bind_runtime  # noqa: E402
from rlsdk.testing import FakeEngine, ServedEngine  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "verifiers_env"


@pytest.fixture
def vf_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))


def test_a_verifiers_environment_becomes_the_runs_settings(vf_path):
    args = RolloutConfig.from_dict({"env": "vf_tiny_sums", "num_rollout": 1}, pm=get_plugin_manager())
    assert args.custom_generate_function_path == "openai_agent" and args.apply_chat_template
    assert args.agent_function_path == "rlsdk.agents.verifiers_agent:verifiers_agent"
    assert args.custom_rm_path == "rlsdk.agents.verifiers_agent:verifiers_reward" and args.num_rollout == 1
    rows = [json.loads(line) for line in Path(args.prompt_data).read_text().splitlines()]
    assert len(rows) == 6 and rows[1]["answer"] == "1"
    assert rows[1]["metadata"] == {"example_id": 1, "verifiers_env": "vf_tiny_sums"}
    assert rows[1]["prompt"][-1] == {"role": "user", "content": "What is 0 + 1?"}
    assert args.eval_datasets[0]["name"] == "vf_tiny_sums-eval"


def test_an_unknown_environment_is_still_an_error_listing_the_installed_ones(vf_path):
    with pytest.raises(Exception, match="unknown environment 'vf_no_such_env'. Choose one of: arithmetic"):
        RolloutConfig.from_dict({"env": "vf_no_such_env"}, pm=get_plugin_manager())


@pytest.mark.parametrize(("wrong", "reward"), [(False, 1.0), (True, 0.2)])
def test_its_rollouts_run_through_the_chat_endpoint_and_its_rubric_scores_them(
    vf_path, small_tokenizer, wrong, reward
):
    pm = get_plugin_manager()
    args = RolloutConfig.from_dict(
        {
            "env": "vf_tiny_sums",
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 2,
            "rollout_max_response_len": 8,
        },
        pm=pm,
    )

    def respond(payload, call):
        a, b = map(
            int, re.findall(r"What is (\d) \+ (\d)\?", small_tokenizer.decode(payload["input_ids"]))[-1]
        )
        return str(a + b + (1 if wrong else 0))

    with ServedEngine(FakeEngine(respond, small_tokenizer)) as served:
        runtime = Runtime(pm, served.engine, served.engine.tokenizer, loop=served._loop)
        runtime.server = served.handle
        bind_runtime(args, runtime)
        source = DataSource(args, pm=pm, tokenizer=small_tokenizer)
        out = served.run(rollout_step(args, 0, source, runtime))
    samples = [s for g in out.samples for s in g]
    assert len(samples) == 4 and {s.reward for s in samples} == {reward}
    assert samples[0].metadata["agent"]["turns"] == 1 and 1 in samples[0].loss_mask
    assert out.metrics["rollout/rubric/correct_answer"] == (0.0 if wrong else 1.0)
    assert out.metrics["rollout/rubric/brevity"] == 1.0
