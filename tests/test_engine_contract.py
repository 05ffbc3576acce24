"""The engine contract (:data:`rlsdk.testing.ENGINE_CONTRACT`) held against the SGLang client: over real HTTP
on loopback in front of ``rlsdk serve`` (SGLang 0.5.17's protocol, held to a real server's answers in
``test_sglang_protocol.py``) serving the embedded engine on the tiny Llama. The vllm engine runs the same
checks in ``plugins/engine_vllm/tests/test_vllm_contract.py``. CUDA IPC and memory release have no stand-in
here (SGLang's are held to its restated weight endpoints in ``test_weight_sync_strategies.py``): those
checks say so and are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlsdk.engine_api import SGLangClient
from rlsdk.testing import ENGINE_CONTRACT, EngineKit, ServedEngine, check_engine_contract


@pytest.fixture
def served(tiny_llama: Path, tmp_path: Path):
    from rlsdk_embedded import EmbeddedEngine

    with ServedEngine(
        EmbeddedEngine(str(tiny_llama), device="cpu", threads=1), weights_dirs=[tmp_path]
    ) as running:
        yield running


@pytest.mark.plugins("rlsdk_embedded")
@pytest.mark.parametrize("name", list(ENGINE_CONTRACT))
def test_the_sglang_client_keeps_the_engine_contract(
    name: str, served, tiny_llama: Path, tmp_path: Path
) -> None:
    kit = EngineKit.for_model(tiny_llama, tmp_path)
    if reason := check_engine_contract(name, lambda: SGLangClient(served.url), kit):
        pytest.skip(reason)
