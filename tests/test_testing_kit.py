"""rlsdk.testing itself: importable without pytest, FakeEngine's protocol, check_custom_generate."""

import asyncio
import subprocess
import sys

import pytest

from rlsdk import CustomGenerate, RolloutConfig, Sample, hookimpl
from rlsdk.rollout.generate import generate, sampling_params_for
from rlsdk.testing import FakeEngine, FakeReply, ServedEngine, check_custom_generate


def test_the_kit_imports_without_pytest():
    """Benchmarks and scripts use FakeEngine and the checks without the test extra."""
    code = ("import sys; sys.modules['pytest'] = None; import asyncio; from rlsdk.testing import FakeEngine; "
            "print(asyncio.run(FakeEngine(['hi']).generate({'input_ids': [1]}))['text'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "hi", done.stderr


def test_fake_engine_cuts_like_sglang_and_aborts_running_requests():
    async def scenario():
        engine = FakeEngine(["one two|three"] * 2 + ["abcdef", FakeReply("slow answer", seconds=30)])
        keep = {"stop": ["|"], "no_stop_trim": True}
        stopped = await engine.generate({"input_ids": [1], "sampling_params": keep, "return_logprob": True})
        trimmed = await engine.generate({"input_ids": [1], "sampling_params": {"stop": ["|"]}})
        cut = await engine.generate({"input_ids": [1], "sampling_params": {"max_new_tokens": 3}})
        slow = asyncio.create_task(engine.generate({"input_ids": [1]}))
        while (await engine.load())["num_running_reqs"] == 0:
            await asyncio.sleep(0)
        await engine.abort()
        return stopped, trimmed, cut, await slow

    stopped, trimmed, cut, slow = asyncio.run(scenario())
    assert stopped["text"] == "one two|"
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "|"}
    assert trimmed["text"] == "one two" and trimmed["output_ids"] == list(b"one two|")  # SGLang trims by default
    assert [entry[1] for entry in stopped["meta_info"]["output_token_logprobs"]] == list(b"one two|")
    assert cut["text"] == "abc" and cut["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert "output_token_logprobs" not in cut["meta_info"]  # only when return_logprob asks, as in SGLang
    assert slow["meta_info"]["finish_reason"]["type"] == "abort" and slow["output_ids"] == []


def test_generate_outside_a_run_survives_one_event_loop_after_another():
    """A generator called from scripts with asyncio.run twice: the engine client is not tied to the first
    loop (it used to fail with "Event loop is closed")."""
    with ServedEngine(FakeEngine(["first", "second"])) as served:
        host, port = served.url.removeprefix("http://").split(":")
        args = RolloutConfig(sglang_router_ip=host, sglang_router_port=int(port))
        texts = []
        for _ in range(2):
            sample = Sample(index=0, prompt="p", tokens=[1, 2])
            texts.append(asyncio.run(generate(args, sample, sampling_params_for(args))).response)
    assert texts == ["first", "second"]


class Generators:
    @hookimpl
    def rlsdk_custom_generates(self):
        async def echo_twice(args, sample, sampling_params):
            for _ in range(2):
                await generate(args, sample, sampling_params)
            return sample

        async def forgets_the_prompt(args, sample, sampling_params):
            await generate(args, sample, sampling_params)
            del sample.tokens[0]
            return sample

        yield CustomGenerate(name="echo_twice", func=echo_twice)
        yield CustomGenerate(name="forgets_the_prompt", func=forgets_the_prompt)


def test_check_custom_generate_runs_the_generator_on_a_fake_engine(rlsdk_pm):
    rlsdk_pm.register(Generators())
    sample = check_custom_generate(rlsdk_pm, "echo_twice", replies=["ab", "cd"])
    assert sample.response == "abcd" and sample.response_length == 4
    with pytest.raises(AssertionError, match="changed the prompt's tokens"):
        check_custom_generate(rlsdk_pm, "forgets_the_prompt", replies=["ab"])
