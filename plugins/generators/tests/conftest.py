"""A module-scoped ``rlsdk serve`` of the real small model (SmolLM2-135M-Instruct, CPU, float32)."""

from __future__ import annotations

import pytest

from rlsdk.testing import ServedEngine


@pytest.fixture(scope="module")
def served():
    from rlsdk_generators.embedded import EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=32)) as served:
        yield served
