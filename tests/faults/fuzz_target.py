"""A service for the fuzz suite (:mod:`fuzzing`), in a process of its own, so that what the test process
does (drawing examples, building bodies) is never counted as the service's stall or memory.

``python fuzz_target.py KIND FOLDER [TOKEN]`` serves KIND (``engine``: ``rlsdk serve``'s server with the
chat, messages and session routes, its template writing tool schemas out as JSON; ``chat``: the chat
server of ``start_chat_server``, its template writing none; ``buffer``: the rollout buffer service;
``view``: ``rlsdk view`` over a run folder written in FOLDER; ``tinker``: ``rlsdk tinker serve`` on the
tiny Llama of tests/conftest.py, TOKEN its API key) on loopback over
:class:`rlsdk.testing.FakeEngine` and a word tokenizer made in FOLDER, prints
``{"url", "routes"}`` as one JSON line, then answers each line on stdin with one JSON line: the event
loop's worst lateness since the last answer (``stall``, seconds), the process's peak resident memory
(``peak_mb``) and what the service holds (``state``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from conftest import CHAT_TEMPLATE, TOOLS_CHAT_TEMPLATE, RecordingEngine, make_word_tokenizer  # noqa: E402
from fuzzing import LoopWatch, routes_of  # noqa: E402


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def write_run(folder: Path) -> None:
    """A run folder of two steps as a run writes it (samples with non-ASCII text, a dropped group)."""
    from rlsdk import RolloutConfig, Sample, get_plugin_manager
    from rlsdk.run.output import RunOutput
    from rlsdk.types import RolloutFnTrainOutput

    output = RunOutput(folder)
    for step in range(2):
        kept = [[Sample(group_index=0, index=i, prompt="2 + 3?", tokens=[1, 2, 3, 4], response=text,
                        response_length=1, reward=float(i), rollout_log_probs=[-0.5]) for i, text in
                 enumerate(["5", "Größe 6"])]]  # fmt: skip
        output.write_step(step, RolloutFnTrainOutput(samples=kept, metrics={"rollout/reward_mean": 0.5}))
    args = RolloutConfig(num_rollout=2, output_dir=str(folder))
    output.save_state(output.run_state(2, {}, args, get_plugin_manager(load_entrypoints=False)))


def main(kind: str, folder: Path, token: str | None) -> None:
    from rlsdk import get_plugin_manager
    from rlsdk.runtime import BackgroundLoop

    pm = get_plugin_manager(load_entrypoints=False)
    loop = BackgroundLoop("fuzz-target")
    path_values: dict[str, str] = {}
    if kind == "tinker":
        from rlsdk_embedded.engine import EmbeddedEngine

        from rlsdk.testing import tiny_llama
        from rlsdk.tinker.server import start_tinker_server
        from rlsdk.tinker.service import TinkerService
        from rlsdk.tinker.training import Placement

        model = tiny_llama(folder / "tiny-llama")
        tinker = TinkerService(
            {"test/tiny-llama": model},
            lambda weights: EmbeddedEngine(str(weights), device="cpu", threads=1),
            folder / "checkpoints",
            Placement("cpu", "float32", 1),
        )
        server = loop.run(start_tinker_server(tinker, [token or ""]))
        app, url = server.runner.app, server.url

        def state() -> dict:
            return {}

    elif kind == "view":
        from rlsdk.view.runs import RunFolder
        from rlsdk.view.server import start_view

        write_run(folder / "run")
        handle = loop.run(start_view([RunFolder(folder / "run", 0)], token=token or ""))
        app, url = handle.runner.app, handle.base
        path_values = {"run": "0", "step": "0", "file": "rollouts", "n": "0"}

        def state() -> dict:
            return {}

    elif kind == "buffer":
        from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore, start_buffer_server

        service = BufferService(pm, TrajectoryStore(folder / "buffer"))
        server = loop.run(start_buffer_server(service, port=0, token=token))
        app, url = server.runner.app, server.url

        def state() -> dict:
            return service.store.counts()

    else:
        from transformers import AutoTokenizer

        from rlsdk.agents.server import chat_endpoint, start_chat_server
        from rlsdk.run.engine_server import start_server

        tokenizer = AutoTokenizer.from_pretrained(make_word_tokenizer(folder / "tokenizer"))
        tokenizer.chat_template = TOOLS_CHAT_TEMPLATE if kind == "engine" else CHAT_TEMPLATE
        engine = RecordingEngine(tokenizer)
        loop.run(engine.start())
        if kind == "engine":
            handle = loop.run(start_server(engine, token=token, pm=pm))
            app, url, chat = handle.runner.app, handle.url, handle.chat
        else:
            chat = loop.run(chat_endpoint(engine, tokenizer, pm=pm))
            handle = loop.run(start_chat_server(chat, token=token))
            app, url = handle.runner.app, handle.url
        path_values = {"session": chat.sessions.open().id}

        def state() -> dict:
            return {"pauses": engine.pauses, "requests": engine.requests, "sessions": len(chat.sessions)}

    print(json.dumps({"url": url, "routes": routes_of(app, **path_values)}), flush=True)
    with LoopWatch(loop.loop) as watch:
        for _ in sys.stdin:
            print(json.dumps({"stall": watch.worst, "peak_mb": peak_mb(), "state": state()}), flush=True)
            watch.worst = 0.0


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None)
