"""slime compatibility both ways, without slime's code (it cannot be vendored): rlsdk's plugins handed to
slime by name (``rlsdk.slime.<kind>.<name>``, called as slime calls them), and slime's modules standing in
as rlsdk's when slime is absent. Where slime itself must be present, a stand-in ``slime`` package written
here (its own ``Sample``, ``Status`` and ``DynamicFilterOutput`` classes, by slime's names and shapes) is
put on the path: the real one needs ray, sglang and megatron."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import sys
import textwrap

import pytest

from rlsdk.testing import score
from rlsdk import DynamicFilterOutput, Sample, hookimpl, slime_compat
from rlsdk.plugins.loading import load_callable
from rlsdk.plugins.kinds import BufferFilter, DynamicFilter, Reward
from rlsdk.slime import adapters

FAKE_SLIME = {
    "slime/__init__.py": "",
    "slime/utils/__init__.py": "",
    "slime/utils/types.py": """
        import enum
        from dataclasses import dataclass, field

        @dataclass
        class Sample:
            class Status(enum.Enum):
                PENDING = "pending"
                COMPLETED = "completed"
                TRUNCATED = "truncated"
                ABORTED = "aborted"
                FAILED = "failed"
            index: int | None = None
            response: str = ""
            label: str | None = None
            reward: float | None = None
            status: Status = Status.PENDING
            metadata: dict = field(default_factory=dict)

            def to_dict(self):
                return {**self.__dict__, "status": self.status.value}

            @staticmethod
            def from_dict(data):
                data = dict(data)
                data["status"] = Sample.Status(data["status"])
                return Sample(**{k: v for k, v in data.items() if k in Sample.__dataclass_fields__})
    """,
    "slime/rollout/__init__.py": "",
    "slime/rollout/filter_hub/__init__.py": "",
    "slime/rollout/filter_hub/base_types.py": """
        from dataclasses import dataclass

        @dataclass
        class DynamicFilterOutput:
            keep: bool
            reason: str | None = None
            keep_when_insufficient: bool = False
    """,
}


def forget_slime() -> None:
    for name in [n for n in sys.modules if n == "slime" or n.startswith("slime.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def no_slime():
    """The compatibility layer on, no slime anywhere; everything undone afterwards."""
    forget_slime()
    slime_compat.install()
    yield
    slime_compat.uninstall()
    forget_slime()


@pytest.fixture
def fake_slime(tmp_path, monkeypatch):
    """A slime package on the path (with the layer on, as under `rlsdk run`: slime must win)."""
    for rel, text in FAKE_SLIME.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_slime()
    slime_compat.install()
    yield importlib.import_module("slime.utils.types")
    slime_compat.uninstall()
    forget_slime()


class Plugins:
    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="length_sync", func=lambda args, sample, **kw: float(len(sample.response)), cheap=True)

        async def labelled(args, sample, **kw):
            return {"score": float(sample.response == sample.label), "grader_timeout": args.grader_timeout}
        yield Reward(name="labelled", func=labelled)

    @hookimpl
    def rlsdk_dynamic_filters(self):
        def spread(args, samples, **kw):
            rewards = [s.reward for s in samples]
            keep = max(rewards) > min(rewards)
            return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{rewards[0]}")
        yield DynamicFilter(name="spread", func=spread)
        yield DynamicFilter(name="always", func=lambda args, samples, **kw: True)

    @hookimpl
    def rlsdk_buffer_filters(self):
        def first(args, rollout_id, buffer, num_samples):
            taken = buffer[:num_samples]
            del buffer[:num_samples]
            return taken
        yield BufferFilter(name="first", func=first)


@pytest.fixture
def plugins(rlsdk_pm, monkeypatch):
    rlsdk_pm.register(Plugins(), "test_plugins")
    monkeypatch.setattr(adapters, "plugin_manager", lambda: rlsdk_pm)
    return rlsdk_pm


def load_function(path: str):
    """slime's loader: import the module, getattr the name."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ----- rlsdk plugins inside slime ------------------------------------------------------------------

@pytest.mark.plugins('rlsdk_rm_hub')
def test_rewards_are_awaitable_with_slimes_parameter_names_and_args(plugins):
    """slime awaits every custom reward; a sync rlsdk reward becomes a coroutine function. slime's args
    lack rlsdk's options: rlsdk's defaults answer for them."""
    sync_reward = load_function("rlsdk.slime.reward.length_sync")
    assert inspect.iscoroutinefunction(sync_reward)
    assert tuple(inspect.signature(sync_reward).parameters)[:2] == ("args", "sample")
    args = argparse.Namespace(rm_type=None, custom_rm_path="rlsdk.slime.reward.length_sync", reward_key=None)
    assert asyncio.run(sync_reward(args, Sample(response="abcd"))) == 4.0
    reward = asyncio.run(load_function("rlsdk.slime.reward.labelled")(args, Sample(response="4", label="4")))
    assert reward == {"score": 1.0, "grader_timeout": 10.0}


def test_a_reward_returning_garbage_raises_naming_the_plugin(plugins):
    plugins.register(type("Bad", (), {"rlsdk_rewards": hookimpl(lambda self: [
        Reward(name="bad", func=lambda args, sample, **kw: "1.0", cheap=True)])})(), "bad_plugin")
    with pytest.raises(Exception, match="bad.*expected a number or a dict"):
        asyncio.run(load_function("rlsdk.slime.reward.bad")(argparse.Namespace(), Sample()))


def test_unknown_names_list_the_installed_ones(plugins):
    import rlsdk.slime.reward as reward_module

    with pytest.raises(AttributeError, match="length_sync"):
        load_function("rlsdk.slime.reward.lenght_sync")
    assert {"labelled", "length_sync"} <= set(dir(reward_module))


def test_dynamic_filters_return_slimes_own_output_class(plugins, fake_slime):
    """slime wraps anything but its own DynamicFilterOutput as a truthy keep, so the class must be
    slime's: checked by class, name and shape, for a dropped group and for a bare-bool filter."""
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput as SlimeOutput

    spread = load_function("rlsdk.slime.dynamic_filter.spread")
    verdict = spread(argparse.Namespace(), [fake_slime.Sample(reward=1.0), fake_slime.Sample(reward=1.0)])
    assert type(verdict) is SlimeOutput and type(verdict).__module__ == "slime.rollout.filter_hub.base_types"
    assert (verdict.keep, verdict.reason, verdict.keep_when_insufficient) == (False, "zero_std_1.0", False)
    assert load_function("rlsdk.slime.dynamic_filter.always")(None, []) == SlimeOutput(keep=True)


def test_buffer_filters_take_rollout_id_none(plugins):
    buffer = [[Sample(index=1)], [Sample(index=2)]]
    taken = load_function("rlsdk.slime.buffer_filter.first")(argparse.Namespace(), None, buffer, 1)
    assert [g[0].index for g in taken] == [1] and [g[0].index for g in buffer] == [2]


@pytest.mark.plugins('rlsdk_filter_hub')
def test_drop_stale_serves_oldest_first_when_slime_gives_no_rollout_id():
    from rlsdk_filter_hub.buffer import drop_stale

    old, new, unknown = ([Sample(metadata={"start_rollout_id": n})] for n in (1, 5, None))
    buffer = [new, unknown, old]
    taken = drop_stale(argparse.Namespace(buffer_max_staleness=1), None, buffer, 2)
    assert taken == [old, new] and buffer == [unknown]


def test_slimes_data_source_is_called_as_get_samples_n():
    class SlimeDataSource:  # slime's signature: no rollout_id
        def __init__(self):
            self.added = []

        def get_samples(self, num_samples):
            return [[Sample(index=i)] for i in range(num_samples)]

        def add_samples(self, samples):
            self.added += samples

    source = adapters.SlimeDataSource(SlimeDataSource())
    assert [g[0].index for g in source.get_samples(2, 7)] == [0, 1]
    source.add_samples([[Sample(index=9)]], 7)
    assert source.data_source.added[0][0].index == 9


def test_slime_samples_convert_to_rlsdk_and_back(fake_slime):
    slime_sample = fake_slime.Sample(index=3, response="r", status=fake_slime.Sample.Status.COMPLETED)
    ours = adapters.to_rlsdk(slime_sample)
    assert type(ours) is Sample and ours.status is Sample.Status.COMPLETED and ours.index == 3
    back = adapters.to_slime(ours)
    assert type(back) is fake_slime.Sample and back.status is fake_slime.Sample.Status.COMPLETED


# ----- slime's modules without slime -----------------------------------------------------------------

@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_slime_modules_stand_in_as_rlsdks(no_slime):
    from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput as StandIn
    from slime.rollout.filter_hub.base_types import call_dynamic_filter, should_drop_dynamic_filter_output
    from slime.rollout.rm_hub.math_dapo_utils import compute_score
    from slime.utils.types import Sample as SlimeSample

    assert SlimeSample is Sample and StandIn is DynamicFilterOutput
    assert compute_score("Answer: 42", "42")["acc"] is True
    assert call_dynamic_filter(None, None, []) == StandIn(keep=True)
    assert call_dynamic_filter(lambda *a: False, None, []) == StandIn(keep=False)
    lenient = StandIn(keep=False, keep_when_insufficient=True)
    assert not should_drop_dynamic_filter_output(lenient, remaining_batch_size=2, target_data_size=2)
    assert should_drop_dynamic_filter_output(lenient, remaining_batch_size=3, target_data_size=2)
    legacy = call_rollout_fn(lambda args, rollout_id, data_source, evaluation: [[Sample()]], None, 0, None,
                             evaluation=False)
    assert isinstance(legacy, RolloutFnTrainOutput) and len(legacy.samples) == 1
    assert sys.modules["rlsdk.types"].__spec__.name == "rlsdk.types"
    with pytest.raises(ModuleNotFoundError, match="stands in only for"):
        importlib.import_module("slime.backends.megatron_utils.loss")


def test_a_real_slime_is_never_shadowed(fake_slime):
    assert fake_slime.Sample is not Sample and fake_slime.__file__.endswith("slime/utils/types.py")


def test_the_layer_can_be_switched_off(monkeypatch):
    forget_slime()
    monkeypatch.setenv("RLSDK_SLIME_COMPAT", "0")
    assert slime_compat.install() is False and not slime_compat.installed()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("slime.utils.types")


def test_loading_a_path_turns_the_layer_on_and_puts_the_files_folder_on_sys_path(tmp_path, monkeypatch):
    """slime's examples import their siblings (`from prompts import ...`) and slime's modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    forget_slime()
    (tmp_path / "helpers_for_slime_example.py").write_text("ANSWER = 42\n")
    (tmp_path / "generate.py").write_text(
        "from helpers_for_slime_example import ANSWER\nfrom slime.utils.types import Sample\n"
        "def make():\n    return Sample(label=str(ANSWER))\n")
    try:
        assert load_callable(f"{tmp_path / 'generate.py'}:make")().label == "42"
        assert str(tmp_path) in sys.path
    finally:
        slime_compat.uninstall()
        forget_slime()
        sys.modules.pop("helpers_for_slime_example", None)


# ----- statuses a slime function sets ----------------------------------------------------------------

@pytest.mark.parametrize("status,expected", [("completed", "completed"), ("weird", "failed")])
def test_foreign_and_unknown_statuses_are_never_silently_recycled(rlsdk_pm, rlsdk_args, fake_slime, status, expected):
    """slime's Status members count as rlsdk's (same values); an unknown status fails the sample with
    the cause, where it was once counted as aborted and recycled."""
    from rlsdk.aio.concurrency import ConcurrencyLimit
    from rlsdk.plugins.calls import call_custom_generate
    from rlsdk.plugins.run_plugins import RunPlugins
    from rlsdk.plugins.kinds import CustomGenerate

    async def slime_generator(args, sample, sampling_params):
        sample.status = fake_slime.Sample.Status(status) if status != "weird" else status
        return sample

    rlsdk_pm.register(type("Gen", (), {"rlsdk_custom_generates": hookimpl(lambda self: [
        CustomGenerate(name="slime_generator", func=slime_generator)])})(), "gen")
    args = rlsdk_args.replace(custom_generate_function_path="slime_generator")
    plugins = RunPlugins(args, rlsdk_pm)
    [out] = asyncio.run(call_custom_generate(plugins.one(CustomGenerate), args, Sample(), {}, limit=ConcurrencyLimit(1)))
    assert out.status is Sample.Status(expected)
    if expected == "failed":
        assert "unknown status 'weird'" in out.metadata["generate_error"]


# ----- args, rewards and accounting as slime's functions expect ------------------------------------

def test_args_answer_slimes_arguments_and_survive_deepcopy_and_pickle(rlsdk_args):
    import copy
    import pickle

    from rlsdk.runtime import Runtime, bind_runtime, get_runtime

    assert rlsdk_args.sglang_dp_size == 1 and rlsdk_args.router_policy is None
    assert rlsdk_args.use_distributed_post is False
    runtime = Runtime(None, object())  # type: ignore[arg-type]
    try:
        bind_runtime(rlsdk_args, runtime)
        assert get_runtime(copy.deepcopy(rlsdk_args)) is runtime  # examples deepcopy(args)
        assert pickle.loads(pickle.dumps(rlsdk_args)).__dict__["_rlsdk_runtime"] is None
    finally:
        runtime.loop.close()


def test_rewards_a_generator_already_set_are_kept(rlsdk_pm, rlsdk_args):
    """slime's agents score their samples themselves; slime rewards only samples without one."""

    rlsdk_pm.register(Plugins(), "test_plugins")
    scored, fresh = Sample(response="abc", reward=0.8), Sample(response="abcd")
    score(rlsdk_pm, [scored, fresh], rlsdk_args.replace(rm_type="length_sync"))
    assert (scored.reward, fresh.reward) == (0.8, 4.0)


def test_the_ledger_counts_samples_a_generator_adds():
    from rlsdk.rollout.ledger import StepLedger

    ledger, group = StepLedger(), [Sample()]
    ledger.enter([group])
    group += [Sample(), Sample()]  # slime's multi-agent generator returns several samples for one
    ledger.count_produced(group)
    ledger.keep(group)
    ledger.check()
    assert (ledger.entered, ledger.produced) == (3, 2)


def test_rollouts_rows_keep_the_step_and_the_samples_own_rollout_id():
    from rlsdk.run.output import sample_row

    row = sample_row(3, Sample(rollout_id=7, index=1))
    assert row["rollout_id"] == 3 and row["sample_rollout_id"] == 7
    assert Sample.from_dict(row).index == 1  # rlsdk's own rollouts.jsonl reads back


def test_slimes_multi_value_flags_are_accepted_as_slime_writes_them():
    from rlsdk_cli.app import spread_multi_value_flags

    argv = ["run", "--eval-prompt-data", "aime", "a.jsonl", "gsm", "g.jsonl", "--rollout-stop", "</a>", "</s>",
            "--num-rollout", "2", "--rollout-stop-token-ids"]
    assert spread_multi_value_flags(argv) == [
        "run", "--eval-prompt-data", "aime", "--eval-prompt-data", "a.jsonl", "--eval-prompt-data", "gsm",
        "--eval-prompt-data", "g.jsonl", "--rollout-stop", "</a>", "--rollout-stop", "</s>", "--num-rollout", "2",
        "--rollout-stop-token-ids"]  # left without a value: the parser reports it


# ----- slime's functions under rlsdk with slime installed ----------------------------------------------

SLIME_FUNCTIONS = """
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample


async def reward(args, sample, **kwargs):
    if not isinstance(sample, Sample):
        raise TypeError("Sample must be an instance of Sample class.")
    sample.metadata["seen_by_slime"] = True
    return float(sample.response == sample.label)


async def generate(args, sample, sampling_params):
    assert isinstance(sample, Sample)
    sample.response, sample.status = "4", Sample.Status.COMPLETED
    return sample


def zero_std(args, samples, **kwargs):
    assert all(isinstance(s, Sample) for s in samples)
    return DynamicFilterOutput(keep=False, reason="zero_std_1.0")


def take_last(args, rollout_id, buffer, num_samples):
    taken = buffer[-num_samples:]
    del buffer[-num_samples:]
    return taken
"""


def test_slime_functions_get_slimes_own_samples_when_slime_is_installed(fake_slime, tmp_path, rlsdk_pm,
                                                                          rlsdk_args):
    from rlsdk.rollout.step import call_dynamic_filter

    path = tmp_path / "slime_functions.py"
    path.write_text(SLIME_FUNCTIONS)
    sample = Sample(response="4", label="4", tokens=[1, 2])
    score(rlsdk_pm, [sample], rlsdk_args.replace(custom_rm_path=f"{path}:reward"))
    assert sample.reward == 1.0 and sample.metadata["seen_by_slime"] is True

    generate = rlsdk_pm.resolve("custom_generate", f"{path}:generate")
    out = asyncio.run(generate.func(rlsdk_args, sample, {}))
    assert out is sample and sample.status is Sample.Status.COMPLETED and sample.tokens == [1, 2]

    zero_std = rlsdk_pm.resolve("dynamic_filter", f"{path}:zero_std")
    verdict = asyncio.run(call_dynamic_filter(zero_std, rlsdk_args, [sample]))
    assert isinstance(verdict, DynamicFilterOutput) and (verdict.keep, verdict.reason) == (False, "zero_std_1.0")

    buffer = [[Sample(index=1)], [Sample(index=2)]]
    first = buffer[0][0]
    taken = rlsdk_pm.resolve("buffer_filter", f"{path}:take_last").func(rlsdk_args, 0, buffer, 1)
    assert [g[0].index for g in taken] == [2] and buffer[0][0] is first and len(buffer) == 1
