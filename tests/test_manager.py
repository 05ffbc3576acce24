"""The plugin manager: registration, resolution by name or path, conflicts, entry points."""

import asyncio
import sys

import pytest

from rlsdk import (
    DynamicFilter,
    PluginConflictError,
    PluginError,
    Reward,
    UnknownPluginError,
    get_plugin_manager,
    hookimpl,
)

REWARD_PLUGIN = """
from rlsdk import Reward, hookimpl

def exact(args, sample, **kwargs):
    return float(sample.response == sample.label)

@hookimpl
def rlsdk_rewards():
    yield Reward(name="{name}", func=exact, description="exact match")
"""


class Rewards:
    @hookimpl
    def rlsdk_rewards(self):
        async def async_reward(args, sample, **kwargs):
            return 1.0

        def by_group(args, samples, **kwargs):
            return [1.0 for _ in samples]

        yield Reward(name="  Async_Reward ", func=async_reward)
        yield Reward(name="by_group", func=by_group, group=True)


def module_level_reward(args, sample, **kwargs):
    return 0.5


def test_names_are_normalized_and_resolved(rlsdk_pm):
    rlsdk_pm.register(Rewards())
    assert rlsdk_pm.names("reward") == ["async_reward", "by_group"]
    resolved = rlsdk_pm.resolve("reward", "ASYNC_reward")
    assert resolved.is_async
    assert asyncio.run(resolved.func(None, None)) == 1.0
    group = rlsdk_pm.resolve("reward", "by_group")
    assert group.record.group and not group.is_async


def test_unknown_name_lists_installed_names_and_hints(rlsdk_pm):
    rlsdk_pm.register(Rewards())
    with pytest.raises(UnknownPluginError) as info:
        rlsdk_pm.resolve("reward", "deepscalr")
    message = str(info.value)
    assert "Choose one of: async_reward, by_group" in message
    assert "(plugin may not be installed)" in message


def test_unknown_kind_lists_kinds(rlsdk_pm):
    with pytest.raises(PluginError, match="Choose one of: generate_rollout, custom_generate, reward"):
        rlsdk_pm.resolve("rewards", "x")


def test_misspelled_hook_name_is_an_error_and_nothing_stays_registered(rlsdk_pm):
    class Typo:
        @hookimpl
        def rlsdk_reward(self):
            return []

    with pytest.raises(PluginError, match="rlsdk_reward"):
        rlsdk_pm.register(Typo())
    assert sorted(info.plugin for info in rlsdk_pm.plugin_infos()) == ["agents", "defaults", "run", "training"]  # core's own only


def test_wrong_record_type_names_the_plugin(rlsdk_pm):
    class Wrong:
        @hookimpl
        def rlsdk_rewards(self):
            return [DynamicFilter(name="x", func=lambda args, samples: True)]

    rlsdk_pm.register(Wrong(), name="wrong")
    with pytest.warns(UserWarning, match="plugin 'wrong'.*expected Reward records"):
        assert rlsdk_pm.names("reward") == []
    assert "expected Reward records" in rlsdk_pm.failures[0].error


def test_a_hook_that_raises_is_skipped_not_fatal(rlsdk_pm, monkeypatch):
    """A plugin hook that raised used to break every command, including ones that never use its kind."""

    class Broken:
        @hookimpl
        def rlsdk_rewards(self):
            raise RuntimeError("no GPU here")

        @hookimpl
        def rlsdk_dynamic_filters(self):
            yield DynamicFilter(name="keep", func=lambda args, samples: True)

    class Good:
        @hookimpl
        def rlsdk_rewards(self):
            yield Reward(name="exact", func=module_level_reward)

    rlsdk_pm.register(Broken(), name="broken")
    rlsdk_pm.register(Good(), name="good")
    with pytest.warns(UserWarning, match="skipped plugin 'broken'.*rlsdk_rewards raised RuntimeError: no GPU here"):
        assert rlsdk_pm.names("reward") == ["exact"]
    assert rlsdk_pm.names("dynamic_filter") == ["keep"]
    monkeypatch.setenv("RLSDK_STRICT_PLUGINS", "1")
    strict = get_plugin_manager(load_entrypoints=False, plugins=[Broken()])
    with pytest.raises(PluginError, match="rlsdk_rewards raised RuntimeError: no GPU here"):
        strict.names("reward")


def test_record_rejects_bad_names():
    with pytest.raises(ValueError, match="may not contain"):
        Reward(name="pkg.fn", func=module_level_reward)
    with pytest.raises(ValueError, match="non-empty name"):
        Reward(name=" ", func=module_level_reward)
    with pytest.raises(TypeError, match="must be callable"):
        Reward(name="x", func="not callable")


def test_signature_is_validated_once_when_resolved(rlsdk_pm):
    class BadSignature:
        @hookimpl
        def rlsdk_rewards(self):
            yield Reward(name="bad", func=lambda sample: 1.0)

    rlsdk_pm.register(BadSignature(), name="bad_plugin")
    with pytest.raises(PluginError, match=r"reward 'bad' from plugin 'bad_plugin'.*\(args, sample, \.\.\.\)"):
        rlsdk_pm.resolve("reward", "bad")


@pytest.mark.parametrize("spec", [f"{__name__}:module_level_reward", f"{__name__}.module_level_reward"])
def test_dotted_paths_resolve(rlsdk_pm, spec):
    resolved = rlsdk_pm.resolve("reward", spec)
    assert resolved.func is module_level_reward
    assert resolved.info.plugin == spec


def test_file_path_resolves_with_group_option(rlsdk_pm, tmp_path):
    path = tmp_path / "my_rm.py"
    path.write_text("def rm(args, samples):\n    return [0.0] * len(samples)\n")
    resolved = rlsdk_pm.resolve("reward", f"{path}:rm", group=True)
    assert resolved.record.group
    assert resolved.func(None, [1, 2]) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz.fn", "importing 'no_such_module_xyz' failed"),
        (f"{__name__}:missing", "has no attribute 'missing'"),
        ("/nonexistent/file.py:fn", "does not exist"),
    ],
)
def test_bad_paths_give_clear_errors(rlsdk_pm, spec, message):
    with pytest.raises(PluginError, match=message):
        rlsdk_pm.resolve("reward", spec)


def test_entry_point_plugin_is_discovered_with_its_distribution(fake_dist):
    fake_dist("rl-plugin-exact", "1.2.0", "exact", "rl_plugin_exact", REWARD_PLUGIN.format(name="exact"))
    pm = get_plugin_manager()
    resolved = pm.resolve("reward", "exact")
    assert (resolved.info.distribution, resolved.info.version, resolved.info.plugin) == (
        "rl-plugin-exact", "1.2.0", "exact")


def test_same_name_from_two_distributions_is_an_error_naming_both(fake_dist):
    fake_dist("rl-plugin-a", "1.0.0", "plugin_a", "rl_plugin_a", REWARD_PLUGIN.format(name="exact"))
    fake_dist("rl-plugin-b", "2.0.0", "plugin_b", "rl_plugin_b", REWARD_PLUGIN.format(name="exact"))
    pm = get_plugin_manager()
    with pytest.raises(PluginConflictError) as info:
        pm.resolve("reward", "exact")
    assert "rl-plugin-a 1.0.0" in str(info.value) and "rl-plugin-b 2.0.0" in str(info.value)
    assert [(k, n) for k, n, _ in pm.conflicts()] == [("reward", "exact")]


def test_plugin_that_fails_to_import_is_reported_and_skipped(fake_dist):
    fake_dist("rl-plugin-broken", "0.1.0", "broken", "rl_plugin_broken", "raise ImportError('no numpy here')\n")
    fake_dist("rl-plugin-exact", "1.0.0", "exact", "rl_plugin_exact", REWARD_PLUGIN.format(name="exact"))
    with pytest.warns(UserWarning, match="skipped plugin 'broken' from rl-plugin-broken 0.1.0"):
        pm = get_plugin_manager()
    assert [(f.entry_point, f.distribution, f.version) for f in pm.failures] == [
        ("broken", "rl-plugin-broken", "0.1.0")]
    assert "no numpy here" in pm.failures[0].error
    assert pm.resolve("reward", "exact").name == "exact"


def test_a_plugin_calling_sys_exit_at_import_is_skipped(fake_dist):
    """``sys.exit()`` at import used to end every command silently (SystemExit is no Exception)."""
    fake_dist("rl-plugin-exits", "0.1.0", "exits", "rl_plugin_exits", "import sys\nsys.exit(3)\n")
    fake_dist("rl-plugin-exact", "1.0.0", "exact", "rl_plugin_exact", REWARD_PLUGIN.format(name="exact"))
    with pytest.warns(UserWarning, match="skipped plugin 'exits' from rl-plugin-exits 0.1.0: SystemExit\\(3\\)"):
        pm = get_plugin_manager()
    assert pm.resolve("reward", "exact").name == "exact"


def test_strict_mode_makes_a_failed_import_fatal(fake_dist, monkeypatch):
    fake_dist("rl-plugin-broken", "0.1.0", "broken", "rl_plugin_broken", "raise ImportError('boom')\n")
    monkeypatch.setenv("RLSDK_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="'broken' from rl-plugin-broken 0.1.0 failed to load.*boom"):
        get_plugin_manager()


def test_disabled_plugins_are_not_loaded(fake_dist, monkeypatch):
    fake_dist("rl-plugin-broken", "0.1.0", "broken", "rl_plugin_broken", "raise ImportError('boom')\n")
    fake_dist("rl-plugin-exact", "1.0.0", "exact", "rl_plugin_exact", REWARD_PLUGIN.format(name="exact"))
    monkeypatch.setenv("RLSDK_DISABLE_PLUGINS", "broken, exact")
    pm = get_plugin_manager()
    assert pm.failures == []
    assert "rl_plugin_broken" not in sys.modules
    assert "exact" not in pm.names("reward")


def test_each_manager_is_fresh(rlsdk_pm):
    rlsdk_pm.register(Rewards())
    assert get_plugin_manager(load_entrypoints=False).names("reward") == []
