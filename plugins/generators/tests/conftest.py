"""A module-scoped ``rlsdk serve`` of the real small model (SmolLM2-135M-Instruct, CPU, float32): the engine the
agents and tools are tested against (its decode paths are tested twice, eager and static, in rlsdk-embedded)."""

from __future__ import annotations

import pytest

from rlsdk.testing import ServedEngine


@pytest.fixture(scope="module")
def served():
    from rlsdk_embedded import EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=32)) as served:
        yield served
