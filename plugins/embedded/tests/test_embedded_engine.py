"""The SGLang client against ``rlsdk serve`` over real HTTP on loopback, with the real small model."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch

from rlsdk.engine_api import EngineRequestError, SGLangClient
from rlsdk.testing import ServedEngine

pytestmark = pytest.mark.slow


def prompt_ids(served, text: str) -> list[int]:
    return served.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


async def with_client(url: str, fn):
    client = SGLangClient(url)
    try:
        return await fn(client)
    finally:
        await client.close()


def via_http(served, payload):
    return asyncio.run(with_client(served.url, lambda c: c.generate(payload)))


def logprobs_of(out) -> list[float]:
    return [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]


def forward_logprobs(served, prompt, output, temperature=1.0, top_k=None) -> list[float]:
    """Log-probs of ``output`` after ``prompt`` from one plain forward pass (no cache, no batch)."""
    model = served.engine.model
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None]).squeeze(1).tolist()


def assert_logprobs_close(out, expected: list[float]) -> None:
    """The response's log-probs equal ``expected`` within 1e-4 (a NaN fails)."""
    torch.testing.assert_close(torch.tensor(logprobs_of(out)), torch.tensor(expected), atol=1e-4, rtol=0)


def payload(prompt: list[int], tokens: int) -> dict:
    """``tokens`` new tokens after ``prompt``, seeded sampling at temperature 1, with log-probs."""
    return {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {
            "temperature": 1.0,
            "sampling_seed": 3,
            "ignore_eos": True,
            "max_new_tokens": tokens,
        },
    }


def test_greedy_over_http_equals_in_process_and_transformers(served):
    prompt = prompt_ids(served, "What is 2 + 3?")
    payload = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 12},
        "return_logprob": True,
    }
    remote = via_http(served, payload)
    local = served.run(served.engine.generate(payload))
    assert remote["output_ids"] == local["output_ids"] and remote["text"] == local["text"]
    with torch.inference_mode():
        reference = served.engine.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert remote["output_ids"] == reference[0, len(prompt) :].tolist()
    assert remote["meta_info"]["prompt_tokens"] == len(prompt)
    assert remote["meta_info"]["completion_tokens"] == len(remote["output_ids"])
    assert remote["meta_info"]["weight_version"] == served.engine.weight_version


def test_batched_rows_match_single_requests(served):
    """Left padding and joining a running batch do not change a greedy row's tokens."""
    prompts = [prompt_ids(served, q) for q in ("Name a fruit.", "What is 7 times 6? Answer briefly.")]
    params = {"temperature": 0, "max_new_tokens": 8}
    batch = via_http(served, {"input_ids": prompts, "sampling_params": params})
    alone = [via_http(served, {"input_ids": p, "sampling_params": params}) for p in prompts]
    assert [b["output_ids"] for b in batch] == [a["output_ids"] for a in alone]


def test_stop_string_trims_text_and_reports_the_match(served):
    prompt = prompt_ids(served, "Count from 1 to 10, separated by commas.")
    free = via_http(
        served, {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 16}}
    )
    assert "3" in free["text"]
    out = via_http(
        served,
        {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 16, "stop": ["3"]}},
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "3"}
    assert out["text"] == free["text"][: free["text"].index("3")]
    assert out["output_ids"] == free["output_ids"][: len(out["output_ids"])]
    kept = via_http(
        served,
        {
            "input_ids": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 16, "stop": ["3"], "no_stop_trim": True},
        },
    )
    assert "3" in kept["text"]


def test_stop_token_id_stays_in_output_ids_not_in_text(served):
    prompt = prompt_ids(served, "Count from 1 to 10, separated by commas.")
    free = via_http(served, {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    stop_id = free["output_ids"][3]
    out = via_http(
        served,
        {
            "input_ids": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "stop_token_ids": [stop_id]},
        },
    )
    position = free["output_ids"].index(stop_id)
    assert out["output_ids"] == free["output_ids"][: position + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["text"] == served.engine.tokenizer.decode(
        free["output_ids"][:position], skip_special_tokens=True
    )


def test_eos_stops_with_its_id(served):
    out = via_http(
        served,
        {
            "input_ids": prompt_ids(served, "Say hi."),
            "sampling_params": {"temperature": 0, "max_new_tokens": 64},
        },
    )
    eos = served.engine.tokenizer.eos_token_id
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert out["output_ids"][-1] == eos


def test_min_new_tokens_holds_eos_off_until_the_count(served):
    """SGLang's min_new_tokens: the stop tokens (EOS, ``stop_token_ids``) cannot be sampled before it, so a
    greedy reply that would end after a few tokens runs on to the minimum; the log-probs reported are
    those of the distribution drawn from (the stop tokens masked out)."""
    prompt = prompt_ids(served, "Say hi.")
    eos = served.engine.tokenizer.eos_token_id
    free = via_http(
        served, {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 64}}
    )
    short = len(free["output_ids"])
    held = via_http(
        served,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 64, "min_new_tokens": short + 3},
        },
    )
    assert held["output_ids"][: short - 1] == free["output_ids"][:-1]  # the same until the EOS came
    assert eos not in held["output_ids"][: short + 3] and len(held["output_ids"]) >= short + 3
    masked = forward_logprobs(served, prompt, held["output_ids"][:short], 1.0)
    assert logprobs_of(held)[short - 1] > masked[-1]  # renormalized without the EOS it would have chosen


def test_repetition_penalty_scales_the_logits_of_tokens_already_generated(served):
    """SGLang's repetition penalty: the logits of tokens the response holds are divided by it (multiplied
    where negative); the prompt's tokens do not count. Greedy decoding with a strong penalty repeats no
    token; the reported log-probs are a forward pass's under those penalized logits."""
    prompt = prompt_ids(served, "Repeat the word cat ten times.")
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    plain = via_http(served, {"input_ids": prompt, "sampling_params": params})
    penalized = via_http(
        served,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {**params, "repetition_penalty": 2.0},
        },
    )
    assert len(set(plain["output_ids"])) < len(plain["output_ids"])  # it repeats without the penalty
    assert penalized["output_ids"] != plain["output_ids"]
    model, output = served.engine.model, penalized["output_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    for step, token in enumerate(output):
        seen = torch.tensor(sorted(set(output[:step])), dtype=torch.long)
        row = logits[step].clone()
        if len(seen):
            row[seen] = torch.where(row[seen] < 0, row[seen] * 2.0, row[seen] / 2.0)
        assert int(row.argmax()) == token
        assert logprobs_of(penalized)[step] == pytest.approx(
            float(torch.log_softmax(row, -1)[token]), abs=1e-4
        )


def test_seeded_sampling_is_reproducible_in_any_batch(served):
    prompt = prompt_ids(served, "Write a word.")
    params = {"temperature": 1.0, "max_new_tokens": 10, "sampling_seed": 1234, "ignore_eos": True}
    first = via_http(served, {"input_ids": prompt, "sampling_params": params})
    crowd = [prompt_ids(served, f"Tell me about {w}.") for w in ("cats", "rain", "maps")]
    batch = via_http(
        served,
        {
            "input_ids": [*crowd, prompt],
            "sampling_params": [{"temperature": 1.0, "max_new_tokens": 10}] * 3 + [params],
        },
    )
    other_seed = via_http(served, {"input_ids": prompt, "sampling_params": {**params, "sampling_seed": 99}})
    assert batch[-1]["output_ids"] == first["output_ids"]
    assert other_seed["output_ids"] != first["output_ids"]


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 20},
        {"temperature": 0.0},
    ],
    ids=["t1", "t0.7-top_k20", "greedy"],
)
def test_logprobs_match_a_forward_pass(served, params):
    prompt = prompt_ids(served, "Give me a random animal.")
    out = via_http(
        served,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {**params, "max_new_tokens": 10, "sampling_seed": 7},
        },
    )
    temperature = params["temperature"] or 1.0
    expected = forward_logprobs(served, prompt, out["output_ids"], temperature, params.get("top_k"))
    assert_logprobs_close(out, expected)


def test_rows_past_the_cache_slack_and_rows_joining_and_leaving_keep_forward_logprobs(served, monkeypatch):
    """A row decodes past its cache buffers' free columns (a refill) while a shorter row joins mid-way
    (a merge) and finishes (a select, whose new buffers the long row outgrows 30 steps before its end);
    both rows' log-probs still match a plain forward pass. A small slack makes the buffers fill up
    within 70 steps."""
    from rlsdk_embedded import batch

    monkeypatch.setattr(batch, "SLACK", 8)
    refills = []  # new buffers for a decode step's incoming column
    fill = batch.SlackLayer._fill
    monkeypatch.setattr(
        batch.SlackLayer, "_fill", lambda self, parts, n: refills.append(n) or fill(self, parts, n)
    )
    engine = served.engine
    long_prompt, short_prompt = prompt_ids(served, "Tell me a long story."), prompt_ids(served, "Say hi.")

    async def both():
        long = asyncio.create_task(engine.generate(payload(long_prompt, batch.SLACK + 60)))
        steps = engine.stats.steps
        while engine.stats.steps < steps + 10:
            await asyncio.sleep(0.01)
        short = await engine.generate(payload(short_prompt, 6))
        return await long, short

    long, short = served.run(both())
    assert len(long["output_ids"]) == batch.SLACK + 60 and len(short["output_ids"]) == 6
    assert any(refills)
    for prompt, out in ((long_prompt, long), (short_prompt, short)):
        expected = forward_logprobs(served, prompt, out["output_ids"])
        assert_logprobs_close(out, expected)


def test_prompts_sharing_a_prefix_prefill_it_once_and_keep_forward_logprobs(served, monkeypatch):
    """Three distinct prompts (one asked twice) with a common system prompt, prefilled together: the prefill
    runs the shared prefix once, then each prompt's own tokens (of different lengths) on its copied cache; every row's
    log-probs still match a plain forward pass of its whole prompt."""
    engine = served.engine
    system = {"role": "system", "content": "You are a careful assistant who answers in one short sentence."}
    questions = ["What is 2 + 3?", "Name a colour.", "What is the capital of France, the country?"]
    prompts = [
        engine.tokenizer.apply_chat_template(
            [system, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in questions
    ]
    prompts.append(prompts[0])
    shapes = []
    forward = engine.model.forward
    monkeypatch.setattr(
        engine.model,
        "forward",
        lambda *a, **k: shapes.append(tuple(k["input_ids"].shape)) or forward(*a, **k),
    )

    async def together():  # all four waiting before the engine takes any (paused meanwhile)
        await engine.pause(mode="in_place")
        tasks = [asyncio.create_task(engine.generate(payload(p, 5))) for p in prompts]
        while (await engine.load())["num_waiting_reqs"] < len(prompts):
            await asyncio.sleep(0.01)
        await engine.resume()
        return await asyncio.gather(*tasks)

    outs = served.run(together())
    monkeypatch.undo()
    shared = next(i for i, tokens in enumerate(zip(*prompts)) if len(set(tokens)) > 1)
    longest = max(len(p) for p in prompts) - shared
    assert shapes[:2] == [(1, shared), (3, longest)]  # the prefix once, then the three distinct prompts
    for prompt, out in zip(prompts, outs):
        assert_logprobs_close(out, forward_logprobs(served, prompt, out["output_ids"]))


def test_top_p_logprobs_are_renormalized_over_the_nucleus(served):
    prompt = prompt_ids(served, "Give me a random animal.")
    out = via_http(
        served,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "top_p": 0.5, "max_new_tokens": 6, "sampling_seed": 3},
        },
    )
    raw = forward_logprobs(served, prompt, out["output_ids"])
    assert all(lp >= r - 1e-6 for lp, r in zip(logprobs_of(out), raw))  # renormalizing raises them
    assert any(lp > r + 1e-3 for lp, r in zip(logprobs_of(out), raw))


def test_abort_all_and_by_rid_return_partial_tokens(served):
    async def scenario(client):
        long = {"sampling_params": {"max_new_tokens": 400, "ignore_eos": True}, "return_logprob": True}
        first = asyncio.create_task(
            client.generate({"input_ids": prompt_ids(served, "Tell a story."), **long, "rid": "story"})
        )
        second = asyncio.create_task(
            client.generate({"input_ids": prompt_ids(served, "Tell a joke."), **long})
        )
        while (await client.load())["num_running_reqs"] < 2:
            await asyncio.sleep(0.05)
        steps = served.engine.stats.steps
        while served.engine.stats.steps < steps + 3:  # both prefilled and decoding
            await asyncio.sleep(0.05)
        await client.abort("story")
        story = await first
        await client.abort()
        joke = await second
        await client.wait_idle(timeout=30)
        return story, joke

    for out in asyncio.run(with_client(served.url, scenario)):
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["meta_info"]["finish_reason"]["message"] == "Aborted"
        assert 0 < out["meta_info"]["completion_tokens"] < 400
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])


def test_64_concurrent_requests_complete_and_are_batched(served):
    steps_before = served.engine.stats.steps
    served.engine.stats.max_batch = 0

    async def scenario(client):
        prompts = [prompt_ids(served, f"What is {i} + {i % 7}?") for i in range(64)]
        return await asyncio.gather(
            *(
                client.generate(
                    {"input_ids": p, "sampling_params": {"temperature": 0.8, "max_new_tokens": 4}}
                )
                for p in prompts
            )
        )

    outs = asyncio.run(with_client(served.url, scenario))
    assert len(outs) == 64
    assert all(o["meta_info"]["finish_reason"]["type"] in ("stop", "length") for o in outs)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert served.engine.stats.max_batch == served.engine.max_batch_size  # rows ran together, bounded
    assert served.engine.stats.steps - steps_before < tokens / 4


def test_engine_keeps_decoding_while_the_event_loop_is_blocked(served):
    """The engine steps on its own thread: a coroutine that holds the event loop (an inline reward or
    a slow filter, say) does not stall generation. The loop is held until ten steps have run."""

    async def scenario():
        payload = {
            "input_ids": prompt_ids(served, "Count to fifty."),
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
        }
        task = asyncio.ensure_future(served.engine.generate(payload))
        await asyncio.sleep(0)  # the request is queued
        before = served.engine.stats.steps
        deadline = time.monotonic() + 120
        while served.engine.stats.steps < before + 10 and time.monotonic() < deadline:
            time.sleep(0.01)  # blocks the event loop
        return served.engine.stats.steps - before, await task

    steps_while_blocked, out = served.run(scenario())
    assert steps_while_blocked >= 10
    assert out["meta_info"]["completion_tokens"] == 40


def test_stream_is_cumulative_and_ends_with_done(served):
    payload = {
        "input_ids": prompt_ids(served, "Say hello."),
        "return_logprob": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
    }
    chunks = asyncio.run(with_client(served.url, lambda c: _collect(c.generate_stream(payload))))
    assert len(chunks) == 5
    for n, chunk in enumerate(chunks, start=1):
        assert len(chunk["output_ids"]) == n == len(chunk["meta_info"]["output_token_logprobs"])
        assert chunk["output_ids"][: n - 1] == chunks[n - 2]["output_ids"] if n > 1 else True
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * 4
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert chunks[-1]["output_ids"] == via_http(served, payload)["output_ids"]


async def _collect(stream):
    return [chunk async for chunk in stream]


def test_a_stream_chunk_holds_back_a_character_split_across_tokens(served):
    """ "🙂" is two tokens: the chunk after the first has no text yet instead of a "\ufffd" that the next
    chunk would replace, so stream texts stay cumulative (a sampled stream hit this now and then)."""
    from rlsdk_embedded.engine import _Request
    from rlsdk_embedded.sampling import SamplingParams

    engine = served.engine
    ids = engine._detokenizer("🙂", add_special_tokens=False)["input_ids"]
    assert len(ids) == 2
    request = _Request(
        rid="r", prompt=[1], params=SamplingParams(), return_logprob=False, text_in_logprobs=False, done=None
    )
    texts = []
    for token in ids:
        request.output.append(token)
        texts.append(engine._text(request, None))
    assert texts == ["", "🙂"]
    assert engine._text(request, {"type": "length", "length": 2}) == "🙂"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'{"input_ids": "not a list"}',
        b'{"input_ids": [1, -5]}',
        b'{"input_ids": [1, 99999999]}',
        b'{"input_ids": []}',
        b'{"sampling_params": {}}',
        b'{"input_ids": [1], "sampling_params": {"temperature": -1}}',
        b'{"input_ids": [1], "sampling_params": {"top_p": 0}}',
        b'{"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}',
        b'{"input_ids": [1], "sampling_params": {"bogus": 1}}',
        b'{"input_ids": [1], "sampling_params": {"regex": "a+"}}',
        b'{"input_ids": [1], "sampling_params": {"repetition_penalty": 0}}',
        b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 5}}',
        b'{"input_ids": [[1], [2]], "sampling_params": [{}]}',
        b'{"input_ids": [1], "stream": true, "sampling_params": {"stop": [""]}}',
    ],
)
def test_malformed_requests_get_400_and_the_server_lives(served, body):
    response = httpx.post(f"{served.url}/generate", content=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["object"] == "error" and response.json()["message"]
    assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200


def test_client_raises_request_errors_with_the_message(served):
    with pytest.raises(EngineRequestError, match="must be list or null"):
        via_http(served, {"input_ids": "not a list"})


def test_pause_holds_new_requests_until_continue(served):
    async def scenario(client):
        await client.pause(mode="in_place")
        task = asyncio.create_task(
            client.generate({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
        )
        await asyncio.sleep(0.5)
        held = not task.done() and (await client.load())["num_waiting_reqs"] == 1
        await client.resume()
        return held, await task

    held, out = asyncio.run(with_client(served.url, scenario))
    assert held and out["meta_info"]["completion_tokens"] == 2


def test_weight_update_from_disk_and_from_a_state_dict(served):
    path = str(served.engine.model_path)
    payload = {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 3}}
    before = via_http(served, payload)

    served.run(served.engine.update_weights_from_disk(path, "step-7"))  # rlsdk serve's route: core's tests
    version = served.run(served.engine.model_info())["weight_version"]
    after = via_http(served, payload)
    assert version == "step-7" and after["meta_info"]["weight_version"] == "step-7"
    assert after["output_ids"] == before["output_ids"]

    engine = served.engine
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    shifted = dict(original)
    shifted["model.norm.weight"] = -original["model.norm.weight"]
    served.run(engine.update_weights(shifted))
    assert engine.weight_version.isdigit()
    assert via_http(served, payload)["output_ids"] != before["output_ids"]
    served.run(engine.update_weights(original, "restored"))
    assert via_http(served, payload)["output_ids"] == before["output_ids"]
    with pytest.raises(ValueError, match="missing"):
        served.run(engine.update_weights({"model.norm.weight": original["model.norm.weight"]}))
    bad = httpx.post(
        f"{served.url}/update_weights_from_disk", json={"model_path": "/no/such/folder"}, timeout=30
    )
    assert bad.status_code == 403 and bad.json()["success"] is False  # no folder allowed on this server


def test_engine_with_static_decode_keeps_finished_rows_until_a_quarter_have_finished(monkeypatch):
    """With static decode a finished row stays in the batch (decoded, its tokens dropped) until a quarter
    of the rows have finished; every row still gets forward-pass log-probs, and the engine counts
    only the tokens it returned. A small slack makes the longest row outgrow its buffers."""
    from rlsdk_embedded import EmbeddedEngine, batch

    monkeypatch.setattr(batch, "SLACK", 8)
    lengths = (batch.SLACK + 60, 4, 12, 40, 40, 40)
    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8, static_decode=True)) as served:
        engine = served.engine
        prompts = [engine.tokenizer(f"Tell me story number {i}.")["input_ids"] for i in range(len(lengths))]
        kept = []

        async def all_rows():
            keep = engine._batch.keep
            engine._batch.keep = lambda rows: kept.append(len(rows)) or keep(rows)
            before = engine.stats.tokens
            outs = await asyncio.gather(*(engine.generate(payload(p, n)) for p, n in zip(prompts, lengths)))
            return outs, engine.stats.tokens - before

        outs, counted = served.run(all_rows())
        assert [len(o["output_ids"]) for o in outs] == list(lengths)
        assert kept[0] == 4  # the 4-token row waited for the 12-token one
        assert counted == sum(lengths)
        for prompt, out in zip(prompts, outs):
            assert_logprobs_close(out, forward_logprobs(served, prompt, out["output_ids"]))


def test_prompt_logprobs_follow_sglang_the_range_first_entry_is_none(served):
    """``logprob_start_len`` with ``max_new_tokens: 0``, as SGLang 0.5.17 answers it: one entry per token
    from the start on, the first ``None`` (SGLang scores from that position, so it has no logits before
    it), the rest equal a plain forward pass. The trust check relies on this shape."""
    prompt = prompt_ids(served, "What is 2 + 3?")
    start = len(prompt) - 4
    out = via_http(
        served,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "logprob_start_len": start,
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
        },
    )
    entries = out["meta_info"]["input_token_logprobs"]
    assert [entry[1] for entry in entries] == prompt[start:]
    assert entries[0][0] is None
    expected = forward_logprobs(served, prompt[: start + 1], prompt[start + 1 :])
    torch.testing.assert_close(
        torch.tensor([e[0] for e in entries[1:]]), torch.tensor(expected), atol=1e-4, rtol=0
    )
