import pytest

from rlsdk import RolloutConfig


@pytest.fixture
def args():
    """Short timeouts so pathological inputs finish quickly; two grading workers at most."""
    return RolloutConfig(rm_type="math", grader_timeout=2.0, grader_workers=1, reward_timeout=20.0)


@pytest.fixture
def hub_pm(rlsdk_pm):
    from rlsdk_rm_hub import plugin

    rlsdk_pm.register(plugin, "rm_hub")
    return rlsdk_pm
