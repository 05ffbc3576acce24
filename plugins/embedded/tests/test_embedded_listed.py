import json

from typer.testing import CliRunner

from rlsdk_cli.app import app


def test_the_embedded_engine_appears_in_plugins_list():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    [row] = [r for r in rows if r["distribution"] == "rlsdk-embedded"]
    assert row["provides"] == {"engine": ["embedded"]}
