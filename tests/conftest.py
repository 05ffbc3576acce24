"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlsdk import hookimpl
from rlsdk.testing import ServedEngine

PR_SET_CHILD_SUBREAPER = 36
"""prctl option (linux/prctl.h): orphaned descendants are re-parented to this process instead of init."""
INTERPRETER_HELPERS = ("multiprocessing", "concurrent.futures")
"""Children that Python's own pools and their resource tracker keep until the interpreter exits."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Make this process (each xdist worker: its own) the subreaper of what its tests start, so that a
    process a test leaves behind stays our descendant after its parent dies and the check below finds it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the check sees only direct children
        pass


def descendants(root: int) -> dict[int, str]:
    """Live (not zombie) descendants of ``root``, pid -> command line, read from /proc."""
    parents: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
            commands[int(entry.name)] = cmdline
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found[child] = commands[child]
            todo.append(child)
    return found


def held_children() -> set[int]:
    """Pids of the child processes this process still holds a live handle to (a ``subprocess.Popen`` not yet
    waited for): a pool kept for the process's lifetime (the math grader's workers), stopped at exit."""
    return {
        obj.pid  # type(), not isinstance(): a proxy's __class__ may warn (torch.distributed.reduce_op)
        for obj in gc.get_objects()
        if issubclass(type(obj), subprocess.Popen) and obj.returncode is None
    }


def leftover_processes(grace: float = 5.0) -> dict[int, str]:
    """What the tests started and left running, after ``grace`` seconds to finish exiting: descendants of
    this process except those under a child it still holds (:func:`held_children`) and Python's pool helpers,
    which exit with the interpreter. An orphan (its parent gone) is re-parented here and held by no one."""
    deadline = time.monotonic() + grace
    while True:
        held = held_children()
        kept = set(held)
        for pid in held:
            kept |= set(descendants(pid))
        left = {
            pid: cmd
            for pid, cmd in descendants(os.getpid()).items()
            if pid not in kept and not any(helper in cmd for helper in INTERPRETER_HELPERS)
        }
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


LEFTOVERS = "leftover_processes"
"""Key of an xdist worker's output holding what its tests left running, for the controller."""
reported_by_workers: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the test run when a process a test started is still alive at its end (then stop it). An xdist
    worker checks its own tests and hands the list to the controller, which fails the run."""
    config = session.config
    worker = hasattr(config, "workeroutput")
    listing = list(reported_by_workers)
    if worker or not config.pluginmanager.hasplugin("dsession"):  # the controller started only workers
        left = leftover_processes() if Path("/proc").is_dir() else {}
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        listing += [f"pid {pid}: {cmd[:200]}" for pid, cmd in sorted(left.items())]
    if worker:
        config.workeroutput[LEFTOVERS] = listing  # type: ignore[attr-defined]
        return
    if listing:
        lines = "".join(f"\n  {line}" for line in listing)
        sys.stderr.write(f"\nprocesses the tests started were still running at the end (now killed):{lines}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: collect what a worker's tests left running."""
    reported_by_workers.extend(getattr(node, "workeroutput", {}).get(LEFTOVERS, []))


LONGEST_FILES = (
    "tests/test_ray.py",
    "plugins/embedded/tests/test_embedded_engine.py",
    "plugins/megatron/tests/test_megatron_parallel.py",
    "tests/test_training_loop.py",
    "tests/test_tinker_cookbook.py",
    "plugins/engine_vllm/tests/test_vllm_ray.py",
    "tests/faults/test_fuzz_services.py",
    "tests/test_run_e2e.py",
    "tests/test_async_training.py",
    "tests/faults/test_deadline_faults.py",
    "tests/test_benchmarks.py",
)
"""The test files that take longest (``--durations=0`` on 2 cores), longest first: xdist's workers each take
whole files (``--dist loadfile``) in the order they were collected, so these go first and the short ones
fill in at the end; a long file collected last ran alone while the other worker sat idle."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:data:`LONGEST_FILES`), the others in their collected order."""
    rank = {path: place for place, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist: take files in the order above, not by test count
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers",
        "plugins(*packages): the test needs these plugin packages (rlsdk_rm_hub, ...) installed; skipped "
        "without them, so core's tests pass with no plugin package",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("plugins"):
        missing = [package for package in mark.args if importlib.util.find_spec(package) is None]
        if missing:
            pytest.skip(f"needs the plugin packages {', '.join(missing)}")


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a plugin distribution as a real ``.dist-info`` folder plus module on ``sys.path``.

    ``fake_dist(dist, version, entry_point, module, source)`` writes ``module.py`` with ``source`` and an
    ``rlsdk`` entry point ``entry_point = module``, exactly what pip would leave behind.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(dist: str, version: str, entry_point: str, module: str, source: str) -> Path:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[rlsdk]\n{entry_point} = {module}\n")
        created.append(module)
        importlib.invalidate_caches()
        return site

    yield make
    for module in created:
        sys.modules.pop(module, None)


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An 'interpreter' whose ``-m sglang.launch_server`` is ``fake_sglang_interpreter.py`` (SGLang needs
    CUDA): pass it as ``sglang_python``."""
    fake = Path(__file__).with_name("fake_sglang_interpreter.py")
    script = tmp_path / "fake-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def pm(rlsdk_pm):
    """A fresh plugin manager with filter_hub registered where it is installed (pop_last and drop_stale
    beside core's pop_first; tests of those are marked ``plugins("rlsdk_filter_hub")``)."""
    if importlib.util.find_spec("rlsdk_filter_hub") is not None:
        rlsdk_pm.register(importlib.import_module("rlsdk_filter_hub.plugin"))
    return rlsdk_pm


def provider_of(*records: Any) -> SimpleNamespace:
    """A plugin providing ``records``, each through its kind's provider hook: what a plugin class with an
    ``@hookimpl`` method per kind, yielding them, registers."""
    by_hook: dict[str, list[Any]] = {}
    for record in records:
        by_hook.setdefault(type(record).hook_name(), []).append(record)
    return SimpleNamespace(**{name: _provides(found) for name, found in by_hook.items()})


def _provides(records: list[Any]) -> Any:
    @hookimpl
    def provide() -> list[Any]:
        return records

    return provide


@pytest.fixture
def plugin_of():
    """:func:`provider_of`: ``plugin_of(Reward(...), Engine(...))`` is a plugin to register."""
    return provider_of


def tiny_train_args(tiny_llama: Path, run_files: tuple[Path, str], out: Path, **options: Any) -> Any:
    """A training run of the tiny Llama on ``run_files`` (data, reward) into ``out``: 4 steps of 4 prompts x 8
    samples of 2 tokens, lr 3e-2, one thread each for the engine and the trainer; ``options`` change any."""
    from rlsdk import RolloutConfig

    data, reward = run_files
    values = {
        "model": str(tiny_llama),
        "prompt_data": str(data),
        "rm_type": reward,
        "train": True,
        "lr": 3e-2,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 8,
        "rollout_max_response_len": 2,
        "num_rollout": 4,
        "engine_threads": 1,
        "train_threads": 1,
        "output_dir": str(out),
        "sync_check_tol": 1e-3,
    }
    values.update(options)
    return RolloutConfig(**values)


@pytest.fixture
def train_args():
    """:func:`tiny_train_args`: ``train_args(tiny_llama, run_files, out, **options)``."""
    return tiny_train_args


def start_rlsdk(*args: str, **kwargs: Any) -> subprocess.Popen:
    """``rlsdk ARGS`` in a subprocess of this interpreter, its output and errors together as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "rlsdk_cli.app", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def killed_then_resumed(flags: list[str], out: Path, timeout: float = 240) -> None:
    """``rlsdk run FLAGS --output OUT``, SIGKILLed (its whole process group) once step 1's checkpoint exists,
    then ``rlsdk run --resume --output OUT`` to its end."""
    killed = start_rlsdk("run", *flags, "--output", str(out), start_new_session=True)
    deadline = time.monotonic() + timeout
    while not (out / "checkpoints" / "step_1").exists():
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    resumed = start_rlsdk("run", "--resume", "--output", str(out))
    assert resumed.wait(timeout=timeout) == 0, resumed.stdout.read()


@pytest.fixture
def rlsdk_cli():
    """:func:`start_rlsdk`: ``rlsdk_cli("run", ...)`` is the CLI's process."""
    return start_rlsdk


@pytest.fixture
def kill_and_resume():
    """:func:`killed_then_resumed`: a run cut by SIGKILL after its second checkpoint, then resumed."""
    return killed_then_resumed


EXPRESSION = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
CALCULATOR = {"name": "calculator", "description": "Evaluate an arithmetic expression.", "parameters": EXPRESSION}


@pytest.fixture(scope="session")
def calculator() -> SimpleNamespace:
    """The calculator tool the agent tests offer the small model, as each API's request lists its tools:
    ``.openai`` (Chat Completions) and ``.anthropic`` (Messages)."""
    return SimpleNamespace(
        openai=[{"type": "function", "function": CALCULATOR}],
        anthropic=[
            {
                "name": CALCULATOR["name"],
                "description": CALCULATOR["description"],
                "input_schema": CALCULATOR["parameters"],
            }
        ],
    )


@pytest.fixture(scope="module")
def served():
    """SmolLM2-135M-Instruct in the embedded engine on CPU, served by ``rlsdk serve``'s server on loopback, once
    per module (skips without rlsdk-embedded); a module's own ``served`` serves something else."""
    EmbeddedEngine = pytest.importorskip("rlsdk_embedded").EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=16)) as served:
        yield served


def agent_args_on(served: Any, func: Any) -> Any:
    """The options of a run whose agent is ``func`` (named ``under_test``) and whose engine is ``served`` (a
    :class:`rlsdk.testing.ServedEngine`): its runtime bound, on the server's loop."""
    from rlsdk import Agent, RolloutConfig, get_plugin_manager
    from rlsdk.runtime import Runtime, bind_runtime

    pm = get_plugin_manager(load_entrypoints=False, plugins=[provider_of(Agent(name="under_test", func=func))])
    args = RolloutConfig.from_dict({"agent_function_path": "under_test"})
    runtime = Runtime(pm, served.engine, served.engine.tokenizer, loop=served._loop)
    runtime.server = served.handle
    bind_runtime(args, runtime)
    return args


@pytest.fixture
def agent_args():
    """:func:`agent_args_on`: ``agent_args(served, func)``."""
    return agent_args_on


REWARD_FILE = '''
def first_token_mod4(args, sample, **kwargs):
    """1 when the first response token id is a multiple of 4 (a quarter of the vocabulary)."""
    return float(sample.response_length > 0 and sample.tokens[sample.prompt_length] % 4 == 0)
'''


ODD_PROMPT_FILTER = '''
from rlsdk import DynamicFilterOutput


def drop_odd_prompts(args, samples, **kwargs):
    """Drops the groups of odd prompts (w1 w2 w3, w3 w4 w5, ...)."""
    return DynamicFilterOutput(keep=int(samples[0].prompt.split()[0][1:]) % 2 == 0, reason="odd_prompt")
'''


@pytest.fixture
def run_files(tmp_path: Path) -> tuple[Path, str]:
    """A training run's inputs for the tiny Llama: 16 prompts of three words, and a reward file that pays
    for a first response token that is a multiple of 4 (``(data, "reward.py:first_token_mod4")``)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    return data, f"{reward}:first_token_mod4"


@pytest.fixture(scope="session")
def trained_run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training run of the tiny Llama, made once per session for ``rlsdk view``'s tests: 3 steps of 2
    prompts x 4 samples under a dynamic filter that drops every group of an odd prompt (reason
    ``odd_prompt``), two optimizer steps per rollout without the rollout's log-probs (so the trainer records
    its own), evals before training and after steps 1 and 2."""
    if importlib.util.find_spec("rlsdk_embedded") is None:
        pytest.skip("needs the plugin package rlsdk_embedded")
    from rlsdk import RolloutConfig
    from rlsdk.run.job import run_job

    folder = tmp_path_factory.mktemp("trained-run")
    data = folder / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}", "label": f"w{i + 3}"}) + "\n" for i in range(8))
    )
    (folder / "reward.py").write_text(REWARD_FILE + ODD_PROMPT_FILTER)
    out = folder / "run"
    args = RolloutConfig(
        model=str(tiny_llama), prompt_data=str(data), label_key="label", rm_type=f"{folder / 'reward.py'}:first_token_mod4",
        train=True, lr=3e-2, num_rollout=3, rollout_batch_size=2, n_samples_per_prompt=4, rollout_max_response_len=4,
        dynamic_sampling_filter_path=f"{folder / 'reward.py'}:drop_odd_prompts", num_steps_per_rollout=2, use_rollout_logprobs=False,
        eval_datasets=[{"name": "words", "path": str(data)}], eval_interval=2, n_samples_per_eval_prompt=2,
        engine_threads=1, train_threads=1, output_dir=str(out), sync_check_tol=1e-3,
    )
    run_job(args)
    return out


@pytest.fixture(scope="session")
def agent_run(small_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder holding one agent sample, written by the run's own writer: a session of the OpenAI
    client through rlsdk's chat endpoint, over a scripted engine (``FakeEngine``, so that the tool call and
    the rewritten question happen every time): the question asked once in other words (a branch), then
    asked, a calculator call, its result, the answer (the trained path)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from rlsdk import Agent, RolloutConfig, RolloutFnTrainOutput, Sample, get_plugin_manager
    from rlsdk.agents.openai_agent import fill_sample
    from rlsdk.agents.server import chat_endpoint, start_chat_server
    from rlsdk.plugins.records import PluginInfo, Resolved
    from rlsdk.run.output import RunOutput
    from rlsdk.testing import FakeEngine

    end = "<|im_end|>"
    replies = ["Six." + end, '{"name": "calculator", "arguments": {"q": "2*3"}}' + end, "It is 6." + end]
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Arithmetic.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]

    async def converse():
        pm = get_plugin_manager(load_entrypoints=False)
        chat = await chat_endpoint(FakeEngine(replies, small_tokenizer), small_tokenizer, pm=pm, tool_call_parser="json")
        server = await start_chat_server(chat)
        try:
            session = chat.sessions.open()
            client = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/{session.id}/v1", api_key="-")

            async def ask(messages):
                reply = await client.chat.completions.create(model="m", messages=messages, tools=tools)
                return reply.choices[0].message

            await ask([{"role": "user", "content": "What is 2 times 3?"}])
            question = [{"role": "user", "content": "What is 2*3?"}]
            call = await ask(question)
            result = {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "6"}
            await ask([*question, call, result])
            return session
        finally:
            await server.close()

    with ThreadPoolExecutor(1) as thread:  # a loop of its own: Playwright's may be running in this thread
        session = thread.submit(asyncio.run, converse()).result()
    folder = tmp_path_factory.mktemp("agent-run")
    small_tokenizer.save_pretrained(folder / "tokenizer")
    agent = Resolved(Agent(name="calculator_agent", func=lambda args, sample, client: None), PluginInfo("calculator_agent"))
    sample = fill_sample(Sample(prompt="What is 2*3?", group_index=0, index=0, label="6"), session, small_tokenizer,
                         agent, {"answer": "6"}, "test")
    sample.reward = 1.0
    output = RunOutput(folder / "run")
    output.write_step(0, RolloutFnTrainOutput(samples=[[sample]], metrics={"rollout/reward_mean": 1.0, "ledger/kept": 1}))
    args = RolloutConfig(hf_checkpoint=str(folder / "tokenizer"), num_rollout=1, output_dir=str(output.folder))
    output.save_state(output.run_state(1, {}, args, get_plugin_manager(load_entrypoints=False)))
    return output.folder


@pytest.fixture
def pip_install(tmp_path: Path):
    """``pip_install(package_folder)``: the package installed for real (no dependencies) into a folder of its
    own, returned for a subprocess's ``PYTHONPATH``."""

    def install(root: Path) -> Path:
        site = tmp_path / "site"
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*command, "--target", str(site), str(root)], check=True, capture_output=True, timeout=180)
        return site

    return install
