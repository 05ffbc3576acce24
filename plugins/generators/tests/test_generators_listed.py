import json

from typer.testing import CliRunner

from rlsdk.testing import check_callable
from rlsdk_cli.app import app


def test_generators_appear_in_plugins_list():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    assert any(r["distribution"] == "rlsdk-generators" for r in rows)


def test_single_turn_meets_the_custom_generate_contract(rlsdk_pm):
    from rlsdk_generators import plugin

    rlsdk_pm.register(plugin)
    assert check_callable(rlsdk_pm, "custom_generate", "single_turn").is_async
