import json

from typer.testing import CliRunner

from rlsdk.testing import check_buffer_filter, check_dynamic_filter
from rlsdk_cli.app import app


def test_filter_hub_appears_in_plugins_list():
    rows = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    assert any(r["distribution"] == "rlsdk-filter-hub" for r in rows)


def test_filters_meet_their_contracts(rlsdk_pm):
    from rlsdk_filter_hub import plugin

    rlsdk_pm.register(plugin)
    verdicts = check_dynamic_filter(rlsdk_pm, "check_reward_nonzero_std")
    assert [v.keep for v in verdicts] == [True, False, False, False, False]
    assert len(check_buffer_filter(rlsdk_pm, "pop_first", num_samples=2)) == 2
