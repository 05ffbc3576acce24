"""rl-plugin-search-r1: retriever, /retrieve server, reward, and the generator.

Most generator tests run against ``rlsdk.testing.FakeEngine``, a stand-in that plays back scripted
turns in SGLang's response shape with SmolLM2's real tokenizer, to check alignment token by token;
``test_search_r1_on_embedded_engine`` runs the real small model, and ``test_search_r1_through_rlsdk_run``
the whole `rlsdk run` command.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rl_plugin_search_r1 import CORPUS, QUESTIONS
from rl_plugin_search_r1 import plugin as search_r1_plugin
from rl_plugin_search_r1.bm25 import load_index
from rl_plugin_search_r1.generator import search_r1
from rl_plugin_search_r1.retriever import format_passages
from rl_plugin_search_r1.reward import search_r1_em
from rl_plugin_search_r1.server import serve_in_thread
from rlsdk import RolloutConfig, Sample, get_plugin_manager
from rlsdk.testing import sampling_params_for
from rlsdk import Runtime
from rlsdk.testing import bind_runtime
from rlsdk.testing import FakeEngine, ServedEngine, check_callable, check_environment, check_reward

PROMPT = "<|im_start|>user\nWhat is the capital of Australia?<|im_end|>\n<|im_start|>assistant\n"


def questions():
    return [json.loads(line) for line in QUESTIONS.read_text().splitlines()]


def test_bm25_finds_the_passage_for_every_shipped_question():
    index = load_index(str(CORPUS))
    for row in questions():
        question = row["input"][-1]["content"]
        ((top, _),) = index.search(question, topk=1)
        assert any(answer.lower() in top["contents"].lower() for answer in row["label"]), question


@pytest.fixture(scope="module")
def retriever_url():
    server, url = serve_in_thread(load_index(str(CORPUS)))
    yield url
    server.shutdown()


def test_retrieve_endpoint_has_search_r1_shape(retriever_url):
    body = {"queries": ["capital of Australia", "deepest lake"], "topk": 2, "return_scores": True}
    result = httpx.post(retriever_url + "/retrieve", json=body).json()["result"]
    assert len(result) == 2 and len(result[0]) == 2
    assert result[0][0]["document"]["contents"].startswith('"Canberra"\n')
    assert result[1][0]["document"]["contents"].startswith('"Lake Baikal"\n')
    assert result[0][0]["score"] >= result[0][1]["score"]
    plain = httpx.post(retriever_url + "/retrieve", json={"queries": ["Jupiter"], "topk": 1}).json()["result"]
    assert plain[0][0]["contents"].startswith('"Jupiter"')


def test_retrieve_endpoint_rejects_bad_requests(retriever_url):
    bad = httpx.post(retriever_url + "/retrieve", json={"query": "x"})
    assert bad.status_code == 400 and "queries" in bad.json()["error"]
    assert httpx.post(retriever_url + "/retrieve", json={"queries": ["x"], "topk": 0}).status_code == 400
    assert httpx.post(retriever_url + "/search", json={}).status_code == 404


def test_reward_exact_match_and_format_score(rlsdk_pm):
    rlsdk_pm.register(search_r1_plugin)
    args = RolloutConfig(extra={"search_r1_format_score": 0.2})

    def sample(response, label=("Canberra",)):
        return Sample(response=response, label=label)

    samples = [
        sample("<think>hm</think><answer> The canberra. </answer>"),
        sample("<answer>Sydney</answer>"),
        sample("Canberra"),
        sample("<answer>x</answer> then <answer>au</answer>", {"target": ["Au"]}),
    ]
    assert check_reward(rlsdk_pm, "search_r1_em", args, samples) == [1.0, 0.2, 0.0, 1.0]
    assert check_reward(rlsdk_pm, "search_r1_em", RolloutConfig(), samples[1:2]) == [0.0]
    with pytest.raises(ValueError, match="no golden answers: name the data.s answer key with --label-key"):
        search_r1_em(args, sample("<answer>Canberra</answer>", None))


def test_installed_plugin_registers_its_names():
    pm = get_plugin_manager()
    assert "search_r1" in pm.names("custom_generate") and "search_r1_em" in pm.names("reward")
    assert pm.resolve("tool", "search").info.distribution == "rl-plugin-search-r1"
    check_callable(pm, "custom_generate", "search_r1")


def test_search_r1_is_an_environment(rlsdk_pm):
    rlsdk_pm.register(search_r1_plugin)
    args = check_environment(rlsdk_pm, "search_r1", train=True)
    assert (args.custom_generate_function_path, args.rm_type, args.label_key) == (
        "search_r1",
        "search_r1_em",
        "label",
    )
    assert args.prompt_data == str(QUESTIONS) and args.apply_chat_template and args.num_rollout == 8


def run_generator(pm, tokenizer, turns, **extra):
    pm.register(search_r1_plugin)
    args = RolloutConfig(extra=extra)
    engine = FakeEngine(turns, tokenizer)
    bind_runtime(args, Runtime(pm, engine, tokenizer))
    prompt_ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    sample = Sample(group_index=0, index=0, prompt=PROMPT, tokens=list(prompt_ids), label=["Canberra"])
    sample = asyncio.run(search_r1(args, sample, sampling_params_for(args)))
    return args, engine, sample, prompt_ids


@pytest.mark.parametrize("served", [False, True], ids=["in_process", "http"])
def test_search_then_answer_masks_information(rlsdk_pm, small_tokenizer, retriever_url, served):
    tok = small_tokenizer
    turn1 = "<think>I need to look this up.</think><search> capital of Australia </search>"
    turn2 = "<think>It says Canberra.</think><answer> Canberra </answer> extra"
    extra = {"search_r1_topk": 2}
    if served:
        extra["search_r1_retriever_url"] = retriever_url
    args, engine, sample, prompt_ids = run_generator(rlsdk_pm, tok, [turn1, turn2], **extra)
    docs = [doc for doc, _ in load_index(str(CORPUS)).search("capital of Australia", 2)]
    information = f"\n\n<information>{format_passages(docs)}</information>\n\n"
    assert information.startswith("\n\n<information>Doc 1(Title: Canberra) Canberra is the capital")
    said2 = "<think>It says Canberra.</think><answer> Canberra </answer>"
    segments = [(turn1, 1, 1), (information, 0, None), (said2, 1, 2)]
    expected_tokens, mask, logprobs = list(prompt_ids), [], []
    for text, trainable, call in segments:
        seg = tok(text, add_special_tokens=False)["input_ids"]
        expected_tokens += seg
        mask += [trainable] * len(seg)
        logprobs += [-call - j / 1000 for j in range(len(seg))] if trainable else [0.0] * len(seg)
    assert sample.tokens == expected_tokens
    assert sample.loss_mask == mask and sample.rollout_log_probs == pytest.approx(logprobs)
    assert sample.response == turn1 + information + said2
    assert sample.status == Sample.Status.COMPLETED and sample.metadata["search_r1"]["searches"] == 1
    assert engine.payloads[0]["sampling_params"]["stop"] == ["</search>", "</answer>"]
    assert search_r1_em(args, sample) == 1.0


def test_dead_retriever_becomes_an_error_observation(rlsdk_pm, small_tokenizer):
    turns = ["<search>anything</search>", "<answer>unknown</answer>"]
    _, _, sample, _ = run_generator(
        rlsdk_pm, small_tokenizer, turns, search_r1_retriever_url="http://127.0.0.1:9"
    )
    assert sample.status == Sample.Status.COMPLETED
    assert "<information>Error: tool 'search' failed: ConnectError" in sample.response
    assert sample.metadata["search_r1"]["errors"][0].startswith("tool 'search' failed: ConnectError")


@pytest.fixture(scope="module")
def served():
    """The real small model behind ``rlsdk serve`` on loopback, one per module."""
    embedded = pytest.importorskip("rlsdk_embedded")
    with ServedEngine(embedded.EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        yield served


def information_blocks(tokenizer, sample):
    """The decoded runs of response tokens with loss mask 0."""
    runs, run = [], []
    for token, mask in zip(sample.tokens[len(sample.tokens) - sample.response_length :], sample.loss_mask):
        if mask:
            if run:
                runs.append(tokenizer.decode(run))
            run = []
        else:
            run.append(token)
    return runs + ([tokenizer.decode(run)] if run else [])


def test_search_r1_on_embedded_engine(rlsdk_pm, served):
    """The real small model, greedy, on a shipped question: its worked examples make it search."""
    rlsdk_pm.register(search_r1_plugin)
    engine = served.engine
    args = RolloutConfig(
        rollout_max_response_len=96, rollout_temperature=0.0, max_turns=2, extra={"search_r1_topk": 1}
    )
    runtime = bind_runtime(args, Runtime(rlsdk_pm, engine, engine.tokenizer))
    row = questions()[3]
    prompt = engine.tokenizer.apply_chat_template(row["input"], tokenize=False, add_generation_prompt=True)
    try:
        sample = served.run(
            search_r1(
                args,
                Sample(group_index=0, index=0, prompt=prompt, label=row["label"]),
                sampling_params_for(args),
            )
        )
    finally:
        runtime.loop.close()
    assert sample.metadata["search_r1"]["searches"] >= 1, sample.response
    assert sample.response.startswith("<search>") and "Canberra is the capital" in sample.response
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length > 0
    blocks = information_blocks(engine.tokenizer, sample)
    assert blocks and all(b.startswith("\n\n<information>Doc 1(Title: ") for b in blocks)
    assert all(
        b.endswith("</information>\n\n") for b in blocks[:-1]
    )  # only the last may be cut by the budget
    model_logprobs = [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m]
    assert all(lp <= 0 for lp in model_logprobs) and any(lp < 0 for lp in model_logprobs)
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if not m)
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)


def test_search_r1_through_rlsdk_run(tmp_path, small_tokenizer):
    """The real `rlsdk` console script on the embedded engine, with the shipped questions; greedy so
    that the model searches (it does on its worked examples)."""
    rlsdk = shutil.which("rlsdk", path=str(Path(sys.executable).parent)) or shutil.which("rlsdk")
    assert rlsdk, "the rlsdk console script is not installed"
    command = [
        rlsdk,
        "run",
        "--custom-generate",
        "search_r1",
        "--rm",
        "search_r1_em",
        "--data",
        str(QUESTIONS),
        "--label-key",
        "label",
        "--apply-chat-template",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--max-new-tokens",
        "96",
        "--temperature",
        "0",
        "--set",
        "search_r1_topk=1",
        "--set",
        "max_turns=2",
        "--output",
        str(tmp_path),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    searched = 0
    for row in rows:
        sample = Sample.from_dict({k: v for k, v in row.items() if k != "rollout_id"})
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length > 0
        assert (
            sample.tokens[: sample.prompt_length]
            == small_tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
        )
        blocks = information_blocks(small_tokenizer, sample)
        assert len(blocks) == sample.metadata["search_r1"]["searches"]
        assert all(b.startswith("\n\n<information>Doc 1(Title: ") for b in blocks)
        trainable = [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m]
        assert all(lp <= 0 for lp in trainable) and any(lp < 0 for lp in trainable)
        assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if not m)
        assert sample.label == questions()[sample.group_index]["label"]
        assert sample.reward == search_r1_em(RolloutConfig(), sample)
        searched += bool(blocks)
    assert searched >= 1
    (metrics,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (
        metrics["ledger/entered"]
        == 4
        == (
            metrics["ledger/kept"]
            + metrics["ledger/dropped"]
            + metrics["ledger/returned"]
            + metrics["ledger/failed"]
        )
    )


def test_appears_in_rlsdk_plugins_list():
    from typer.testing import CliRunner

    from rlsdk_cli.app import app

    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    row = next(r for r in rows if r["distribution"] == "rl-plugin-search-r1")
    assert row["provides"] == {
        "custom_generate": ["search_r1"],
        "reward": ["search_r1_em"],
        "tool": ["search"],
        "environment": ["search_r1"],
    }
