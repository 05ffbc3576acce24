import json

from typer.testing import CliRunner

from rlsdk_cli.app import app


def test_the_vllm_engine_and_its_options_appear_in_the_cli():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    [row] = [r for r in rows if r["distribution"] == "rlsdk-engine-vllm"]
    assert row["provides"] == {"engine": ["vllm"]}
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout
    for option in ("--vllm-url", "--vllm-python", "--vllm-args", "--vllm-startup-timeout"):
        assert option in help_text, option
