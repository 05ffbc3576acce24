"""Core runs and tests without any plugin package: its own entry point registers the ``sglang`` rollout, the
``single_turn`` generator, the ``sglang`` engine (the SGLang-protocol client) and the ``pop_first`` buffer
filter; ``rlsdk serve`` resolves its engine by name. The server behind the client is ``rlsdk serve``'s, in
process, over :class:`rlsdk.testing.FakeEngine` (no model is needed to show what core alone does)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import httpx
import pytest

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.data import DataSource
from rlsdk.engines.sglang_client import SGLangClient
from rlsdk.plugins.calls import call_engine, call_generate_rollout
from rlsdk.run.session import resolve_run_plugins
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import ByteTokenizer, FakeEngine, FakeReply, ServedEngine
from rlsdk import BufferFilter, Engine, GenerateRollout

PLUGIN_PACKAGES = ",".join(sorted(ep.name for ep in importlib.metadata.entry_points(group="rlsdk")
                                  if ep.dist is not None and ep.dist.name != "rlsdk"))
"""Every installed plugin package's entry point: blocked, core's own stay."""
RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]


EXACT = "def exact(args, sample, **kwargs):\n    return float(sample.response == sample.label)\n"


@pytest.fixture
def core_only(monkeypatch):
    """The installed plugins with every plugin package blocked: core's own entry points only."""
    monkeypatch.setenv("RLSDK_DISABLE_PLUGINS", PLUGIN_PACKAGES)
    return get_plugin_manager()


@pytest.fixture
def served():
    engine = FakeEngine(lambda payload, call: FakeReply(ids=list(f"answer {chr(payload['input_ids'][0])}".encode())))
    with ServedEngine(engine) as served:
        yield served


def test_core_registers_the_defaults_itself(core_only):
    assert {info.distribution for info in core_only.plugin_infos()} == {"rlsdk"}
    assert core_only.names("generate_rollout") == ["sglang"]
    assert core_only.names("custom_generate") == ["anthropic_agent", "openai_agent", "single_turn"]
    assert core_only.names("engine") == ["sglang"]
    assert core_only.names("buffer_filter") == ["pop_first"]
    assert core_only.names("trainer") == ["torch"]


def test_core_alone_runs_a_step_against_an_sglang_protocol_server(core_only, served, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}|", "label": f"answer {i}"}) + "\n" for i in range(4)))
    (tmp_path / "rewards.py").write_text(EXACT)
    args = RolloutConfig(engine=served.url, prompt_data=str(data), label_key="label",
                         custom_rm_path=f"{tmp_path}/rewards.py:exact",
                         rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=3)
    plugins = resolve_run_plugins(args, core_only)
    assert {k.kind: plugins.one(k).info.distribution for k in (GenerateRollout, Engine, BufferFilter)} == {
        "generate_rollout": "rlsdk", "engine": "rlsdk", "buffer_filter": "rlsdk"}
    engine = call_engine(plugins.engine, args)
    assert isinstance(engine, SGLangClient) and engine.url == served.url
    runtime = bind_runtime(args, Runtime(core_only, engine, ByteTokenizer()))
    try:
        runtime.run(engine.start())
        source = DataSource(args, pm=core_only, tokenizer=runtime.tokenizer)
        out = call_generate_rollout(plugins.one(GenerateRollout), args, 0, source, runtime=runtime)
        assert [s.reward for g in out.samples for s in g] == [1.0] * 4
        assert source.get_buffer_length() == 1  # the surplus group, served first next step by pop_first
        # Three groups were sent: two kept, the one that finished last (which depends on timing) buffered.
        surplus = source.buffer[0][0].prompt
        assert {group[0].prompt for group in out.samples} | {surplus} == {"0|", "1|", "2|"}
        again = call_generate_rollout(plugins.one(GenerateRollout), args, 1, source, runtime=runtime)
        assert again.samples[0][0].prompt == surplus
    finally:
        runtime.run(engine.close())
        runtime.loop.close()


def test_serve_resolves_its_engine_by_name_and_keeps_its_settings(served):
    """``rlsdk serve --engine sglang --set sglang_url=...``: core's client engine, served as a loopback proxy."""
    proc = subprocess.Popen([*RLSDK, "serve", "--engine", "sglang", "--set", f"sglang_url={served.url}",
                             "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        assert line.startswith("rlsdk serve: fake at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        response = httpx.post(url + "/generate", json={"input_ids": list(b"7|"), "sampling_params":
                                                       {"max_new_tokens": 16}}, timeout=30).json()
        assert response["text"] == "answer 7" and response["meta_info"]["finish_reason"]["type"] == "stop"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(("options", "error"), [
    (["--engine", "nope"], "unknown engine 'nope'. Choose one of: embedded, sglang"),
    (["--engine", "sglang"], "engine sglang without --sglang-url launches SGLang: pass --hf-checkpoint"),
    (["--set", "engine_dtyp=bfloat16"], "unknown option 'engine_dtyp' (did you mean 'engine_dtype'?)"),
])
@pytest.mark.plugins('rlsdk_embedded')
def test_serve_names_what_is_wrong_before_loading_anything(options, error):
    result = subprocess.run([*RLSDK, "serve", "--port", "0", *options], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 2 and error in " ".join(result.stderr.split()), result.stderr


def test_a_source_checkout_has_cores_defaults_without_any_entry_point(monkeypatch):
    """Core registers its own plugins by import (``rlsdk.plugins.manager.CORE_PLUGINS``), as conda and llm do:
    with no distribution installed (no entry point at all) a manager still has every default."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kwargs: [])
    pm = get_plugin_manager()
    defaults = {"generate_rollout": "sglang", "custom_generate": "single_turn", "buffer_filter": "pop_first",
                "trainer": "torch", "engine": "sglang", "loss": "policy_loss"}
    assert {kind: pm.resolve(kind, name).info.distribution for kind, name in defaults.items()} == dict.fromkeys(
        defaults, "rlsdk")
