import json

from typer.testing import CliRunner

from rlsdk_cli.app import app


def test_generators_appear_in_plugins_list():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    [row] = [r for r in rows if r["distribution"] == "rlsdk-generators"]
    assert "engine" not in row["provides"] and row["provides"]["custom_generate"] == ["multi_turn"]
