"""Real services for the fault and attacker suites: ``rlsdk buffer serve`` in a subprocess on loopback, a
misbehaving engine over HTTP, tokenizers built in milliseconds, and ``rlsdk run`` in a subprocess against them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

BUFFER_CLI = [
    sys.executable,
    "-c",
    "from rlsdk_cli.app import main; main()",
    "buffer",
    "serve",
    "--port",
    "0",
]


class BufferProcess:
    """``rlsdk buffer serve`` running in a subprocess; ``url`` once it listens, ``kill()`` is SIGKILL."""

    def __init__(self, data_dir: os.PathLike[str], *options: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*BUFFER_CLI, "--data-dir", str(data_dir), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("rollout buffer on "):
            raise AssertionError(line + self.proc.stderr.read())  # type: ignore[union-attr]
        self.url = line.split()[3]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def buffer_item(instance: str, n: int | None = None, reward: float = 1.0) -> dict:
    """One item for ``/buffer/write``: a two-message chat of group ``instance``, its ``uid`` ``instance-n``
    (none without ``n``: the service makes one); its words are the word tokenizer's."""
    body = {
        "instance_id": instance,
        "reward": reward,
        "messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": f"w{n}"}],
    }
    return body if n is None else {**body, "uid": f"{instance}-{n}"}


def buffer_run_inputs(service: Any, tokenizer: Any, folder: Path, prompt: str) -> tuple[Path, Path]:
    """A run against ``service`` holding group ``a`` (two items): ``tokenizer`` saved in ``folder`` and a
    one-chat data file whose user says ``prompt``; their paths."""
    for n in range(2):
        httpx.post(service.url + "/buffer/write", json=buffer_item("a", n)).raise_for_status()
    saved = folder / "tokenizer"
    tokenizer.save_pretrained(saved)
    chats = folder / "chats.jsonl"
    chats.write_text(json.dumps({"input": [{"role": "user", "content": prompt}]}) + "\n")
    return saved, chats


@pytest.fixture
def buffer_service(tmp_path) -> Iterator:
    """``buffer_service(*options, data_dir=..., env=...)`` starts one; all are killed at the end."""
    started: list[BufferProcess] = []

    def start(
        *options: str, data_dir: os.PathLike[str] | None = None, env: dict[str, str] | None = None
    ) -> BufferProcess:
        started.append(BufferProcess(data_dir or tmp_path / "buffer", *options, env=env))
        return started[-1]

    yield start
    for service in started:
        service.kill()


class MisbehavingEngine:
    """A real HTTP server on loopback that speaks SGLang's ``/generate`` (one token per request, from the
    sum of the prompt's ids, in 0.5.17's response shape) until told to misbehave:

    - ``mode``: ``"ok"``; ``"500"`` (every ``/generate`` an SGLang error body with status 500); ``"garbage"``
      (200 with an HTML page); ``"wrong_shape"`` (200 with JSON that is no ``/generate`` answer);
      ``"broken_after_probe"`` (the health check's one-token request answered, every other one 500);
      ``"silent"`` (every request accepted and never answered), ``"silent_after_probe"`` (the health check
      answered, every other request accepted and never answered);
    - ``fail_next``: that many requests answered 503 first, ``reset_next``: that many connections cut
      before an answer, whatever the mode;
    - ``fail_prompt``: requests with these prompt ids answered 500 (one bad prompt).

    ``requests`` counts the ``/generate`` requests that reached it."""

    def __init__(self) -> None:
        from aiohttp import web

        from rlsdk.runtime import BackgroundLoop

        self.mode = "ok"
        self.fail_next = self.reset_next = 0
        self.fail_prompt: list[int] | None = None
        self.requests = 0
        self._loop = BackgroundLoop("misbehaving-engine")
        self._closing = asyncio.Event()
        app = web.Application()
        app.add_routes([web.post("/generate", self._generate), web.post("/abort_request", self._abort)])
        self._runner = web.AppRunner(app)

        async def start() -> int:
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            return self._runner.addresses[0][1]

        self.url = f"http://127.0.0.1:{self._loop.run(start(), timeout=30)}"

    async def _generate(self, request):
        from aiohttp import web

        from rlsdk.engines.protocol import error_body, finish_length, generate_response

        self.requests += 1
        body = await request.json()
        ids = body.get("input_ids") or [0]
        if self.reset_next:
            self.reset_next -= 1
            request.transport.close()  # the client sees the connection cut before an answer
            return web.Response()
        if self.fail_next:
            self.fail_next -= 1
            return web.json_response(error_body("engine overloaded", 503), status=503)
        probe = ids == [0]
        if self.mode == "silent" or (self.mode == "silent_after_probe" and not probe):
            await self._closing.wait()  # accepted, never answered (until the test ends)
            return web.Response(status=503)
        if self.mode == "500" or (self.mode == "broken_after_probe" and not probe) or ids == self.fail_prompt:
            return web.json_response(error_body("CUDA error: an illegal memory access", 500), status=500)
        if self.mode == "garbage":
            return web.Response(
                text="<html><body>502 Bad Gateway" + " " * 300 + "</body></html>", content_type="text/html"
            )
        if self.mode == "wrong_shape":
            return web.json_response({"choices": [{"text": "hello"}]})
        token = 2 + sum(ids) % 30
        return web.json_response(
            generate_response(
                rid="r",
                text=f" w{token - 2}",
                output_ids=[token],
                prompt_tokens=len(ids),
                finish_reason=finish_length(1),
                weight_version="default",
                logprobs=[-0.5],
            )
        )

    async def _abort(self, request):
        from aiohttp import web

        return web.Response()

    def close(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._closing.set)
        self._loop.run(self._runner.cleanup(), timeout=30)
        self._loop.close()


@pytest.fixture
def misbehaving_engine() -> Iterator[MisbehavingEngine]:
    engine = MisbehavingEngine()
    yield engine
    engine.close()


def make_word_tokenizer(folder: Path) -> str:
    """A word-level tokenizer of 32 words (``<eos>``, ``<pad>``, ``w0`` ... ``w29``) saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<pad>", *[f"w{i}" for i in range(30)]]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>").save_pretrained(
        folder
    )
    return str(folder)


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory) -> str:
    """A folder with a word-level tokenizer of 32 words, built here in milliseconds, for runs against an
    HTTP engine that need ``--hf-checkpoint``."""
    return make_word_tokenizer(tmp_path_factory.mktemp("word-tokenizer"))


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)
TOOLS_CHAT_TEMPLATE = "{% if tools %}system {{ tools | tojson }} <eos> {% endif %}" + CHAT_TEMPLATE
"""A template that writes the tool schemas out as JSON, as Qwen's and Llama's do."""


@pytest.fixture(scope="session")
def chat_tokenizer(word_tokenizer):
    """The word-level tokenizer with a one-line chat template, so a server on a model-less engine
    (:class:`rlsdk.testing.FakeEngine`) also answers ``/v1/chat/completions`` and the session routes."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


class RecordingEngine:
    """A :class:`rlsdk.testing.FakeEngine` (no model) that counts its pauses and weight loads, to tell
    whether a refused request changed anything."""

    def __new__(cls, tokenizer):
        from rlsdk.testing import FakeEngine

        class Recording(FakeEngine):
            pauses = 0

            async def pause(self, mode: str = "abort") -> None:
                self.pauses += 1

        return Recording(lambda payload, call: " w1 <eos>", tokenizer)


FIRST_TOKEN_MOD4 = (
    "def first_mod4(args, sample, **kw):\n    return float(sample.tokens[sample.prompt_length] % 4 == 0)\n"
)


@pytest.fixture
def tiny_run(tiny_llama, tmp_path):
    """``tiny_run(**options)``: the settings of a short ``rlsdk run --train`` on the tiny Llama (embedded
    engine, torch trainer, one thread each) over 16 prompts, rewarded for a first token that is a multiple
    of 4 (``reward.py:first_mod4``), written to ``tmp_path / "out"``; ``options`` override any of them."""
    import json

    from rlsdk import RolloutConfig

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    reward = tmp_path / "reward.py"
    reward.write_text(FIRST_TOKEN_MOD4)

    def make(**options):
        values = {
            "model": str(tiny_llama),
            "prompt_data": str(data),
            "rm_type": f"{reward}:first_mod4",
            "train": True,
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 2,
            "rollout_max_response_len": 2,
            "num_rollout": 2,
            "engine_threads": 1,
            "train_threads": 1,
            "output_dir": str(tmp_path / "out"),
            **options,
        }
        return RolloutConfig(**values)

    make.data = data
    return make


RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]
FAST_RETRIES = ["--set", "sglang_retries=1", "--set", "sglang_backoff=0.01"]


@pytest.fixture
def data(tmp_path) -> Path:
    """Twelve prompts of the word tokenizer's words."""
    path = tmp_path / "data.jsonl"
    path.write_text(
        "".join(json.dumps({"input": f"w{i} w{i + 1}", "label": f"w{i}"}) + "\n" for i in range(12))
    )
    return path


def run_options(engine_url: str, tokenizer: str, data: Path, out: Path, *more: str) -> list[str]:
    return [
        "--engine",
        engine_url,
        "--hf-checkpoint",
        tokenizer,
        "--data",
        str(data),
        "--label-key",
        "label",
        "--rm-type",
        "f1",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--num-rollout",
        "2",
        "--output",
        str(out),
        *FAST_RETRIES,
        *more,
    ]


def rlsdk_run(
    *options: str, command: str = "run", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``rlsdk run`` (or ``command``) in a subprocess, within 120 s; ``env`` replaces the environment."""
    return subprocess.run(
        [*RLSDK, command, *options], check=False, capture_output=True, text=True, timeout=120, env=env
    )
