import json

import pytest
from typer.testing import CliRunner

from rlsdk.testing import check_reward, make_group
from rlsdk_cli.app import app


def test_rm_hub_appears_in_plugins_list():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    assert any(r["distribution"] == "rlsdk-rm-hub" and "f1" in r["provides"].get("reward", []) for r in rows)


def test_f1_meets_the_reward_contract(rlsdk_pm):
    from rlsdk_rm_hub import plugin

    rlsdk_pm.register(plugin)
    samples = make_group([None, None], label="the answer is 1")
    assert check_reward(rlsdk_pm, "f1", samples=samples) == pytest.approx([2 / 3, 1.0])
