"""Where each setting in ``rlsdk run``'s start-up summary (and ``--print-config``) comes from: given, the
environment ``--env`` names, the demo, the saved run of ``--resume``, or the default (issue 56)."""

from __future__ import annotations

from rlsdk import DataSourceFactory, Environment, Sample, hookimpl
from rlsdk_cli.run import configure
from rlsdk_cli.settings import setting_sources, summary_lines


class Rows:
    """A data source of the test's own: two fixed groups, the chat template rendered here."""

    def __init__(self, args):
        self.args = args

    def get_samples(self, num_samples):
        return [[Sample(prompt="<|user|>1 + 1?<|assistant|>", label="2")] for _ in range(num_samples)]

    def add_samples(self, groups):
        pass


class Plugins:
    @hookimpl
    def rlsdk_data_sources(self):
        yield DataSourceFactory(name="rows", func=Rows)

    @hookimpl
    def rlsdk_environments(self):
        def settings():
            return {
                "input_key": "question",
                "rollout_max_response_len": 24,
                "custom_generate_function_path": "single_turn",
                "rollout_sample_hook_path": "tag",
            }

        yield Environment(name="quiz", func=settings, train_settings={"lr": 3e-6})


def summary(rlsdk_pm, options, resumed=False):
    rlsdk_pm.register(Plugins())
    args, given = configure(None, options, [], rlsdk_pm)
    sources = setting_sources(args, given, pm=rlsdk_pm, resumed=resumed)
    return args, sources, "\n".join(summary_lines(args, sources))


def test_an_environments_settings_are_labelled_env_with_its_generator_and_hook(rlsdk_pm):
    args, sources, text = summary(rlsdk_pm, {"env": "quiz", "train": True, "prompt_data": "q.jsonl"})
    assert sources["input_key"] == sources["lr"] == sources["rollout_max_response_len"] == "env"
    assert "input_key = question  (env)" in text and "lr = 3e-06  (env)" in text
    assert "custom_generate_function_path = single_turn  (env)" in text
    assert "rollout_sample_hook_path = ['tag']  (env)" in text
    assert "the demo's settings do not apply" not in text  # an environment, not the demo, was asked for
    assert "prompt_data = q.jsonl  (given)" in text and "env = quiz  (given)" in text
    assert "(default)" not in text.split("lr =")[1].split("\n")[0]


def test_a_data_source_without_data_runs_no_demo(rlsdk_pm):
    args, sources, text = summary(rlsdk_pm, {"data_source_path": "rows"})
    assert args.prompt_data is None and args.choices.get("env") is None
    assert "arithmetic" not in text and "(demo)" not in text
    assert "data_source_path = rows  (given)" in text


def test_the_demo_is_still_labelled_demo(rlsdk_pm):
    args, sources, text = summary(rlsdk_pm, {})
    assert "env = arithmetic  (demo)" in text and sources["prompt_data"] == "demo"


def test_a_resumed_runs_settings_are_labelled_resumed(rlsdk_pm):
    """The saved run's settings come in as the configuration; only what is given now is ``given``."""
    rlsdk_pm.register(Plugins())
    args, _ = configure(None, {"prompt_data": "q.jsonl", "lr": 2e-5, "num_rollout": 9}, [], rlsdk_pm)
    sources = setting_sources(args, {"num_rollout"}, pm=rlsdk_pm, resumed=True)
    assert sources["num_rollout"] == "given"
    assert sources["lr"] == sources["prompt_data"] == "resumed"
    assert sources["eps_clip"] == "default"
