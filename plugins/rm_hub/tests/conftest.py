import pytest

from rlsdk import RolloutConfig
from rlsdk.testing import scored


@pytest.fixture
def args():
    """Short timeouts so pathological inputs finish quickly; two grading workers at most."""
    return RolloutConfig(rm_type="math", grader_timeout=2.0, grader_workers=1, reward_timeout=20.0)


@pytest.fixture
def hub_pm(rlsdk_pm):
    from rlsdk_rm_hub import plugin

    rlsdk_pm.register(plugin, "rm_hub")
    return rlsdk_pm


@pytest.fixture
def graded(hub_pm, args):
    """``graded(response, label, rm="math", metadata=None)``: a sample with ``response`` scored against
    ``label`` by reward ``rm`` as a run scores it (rm_hub registered, :func:`args`' timeouts)."""

    def score(response, label, rm="math", metadata=None):
        return scored(hub_pm, response, label, args.replace(rm_type=rm), metadata)

    return score
