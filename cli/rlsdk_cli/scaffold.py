"""``rlsdk plugins new NAME``: a plugin package that installs and passes its own tests as generated.

The package has a ``pyproject.toml`` with the ``rlsdk`` entry point, ``src/<package>/plugin.py`` with one
example per kind asked for, ``tests/`` using :mod:`rlsdk.testing`, and a README.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

SCAFFOLD_KINDS = (
    "reward",
    "dynamic_filter",
    "over_sampling_filter",
    "buffer_filter",
    "custom_generate",
    "generate_rollout",
    "environment",
)
"""The kinds ``rlsdk plugins new --kind`` writes an example of."""


def package_name(name: str) -> str:
    """The import name for a plugin called ``name`` (``my-rewards`` -> ``my_rewards``); ValueError when
    ``name`` cannot make one."""
    package = re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_")
    if not package or package[0].isdigit() or keyword.iskeyword(package):
        raise ValueError(
            f"{name!r} cannot name a Python package: use letters, digits and dashes, starting with a letter"
        )
    return package


def scaffold(name: str, kinds: list[str], folder: Path) -> Path:
    """Write the plugin package ``name`` with one example of each kind into ``folder / name``; returns
    that folder. A folder that already exists is an error (nothing is overwritten)."""
    unknown = [k for k in kinds if k not in SCAFFOLD_KINDS]
    if unknown:
        raise ValueError(f"unknown kind(s) {', '.join(unknown)}. Choose from: {', '.join(SCAFFOLD_KINDS)}")
    package = package_name(name)
    distribution = package.replace("_", "-")
    root = folder / distribution
    if root.exists():
        raise FileExistsError(f"{root} already exists; choose another name or folder")
    kinds = list(dict.fromkeys(kinds))
    files = {
        "pyproject.toml": PYPROJECT.format(distribution=distribution, package=package),
        "README.md": readme(distribution, package, kinds),
        f"src/{package}/__init__.py": f'"""{distribution}: an rlsdk plugin."""\n',
        f"src/{package}/plugin.py": plugin_module(distribution, package, kinds),
        "tests/conftest.py": 'pytest_plugins = ["rlsdk.testing"]\n',
        "tests/test_plugin.py": test_module(package, kinds),
    }
    if "environment" in kinds:
        files[f"src/{package}/data/train.jsonl"] = environment_rows(64, 0)
        files[f"src/{package}/data/eval.jsonl"] = environment_rows(16, 64)
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.1.0"
description = "An rlsdk plugin"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["rlsdk>=0.2,<0.3"]

[project.optional-dependencies]
test = ["pytest>=8"]

[project.entry-points.rlsdk]
{package} = "{package}.plugin"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
{package} = ["data/*.jsonl"]

[tool.pytest.ini_options]
testpaths = ["tests"]

[tool.ruff]
line-length = 110
src = ["src"]
"""

EXAMPLES = {
    "reward": (
        '''\
def exact_match(args, sample, **kwargs):
    """1.0 when the response, stripped, equals the label; 0.0 otherwise."""
    return float(sample.response.strip() == str(sample.label).strip())
''',
        "Reward",
        "rlsdk_rewards",
        "exact_match",
        "exact match against the label",
    ),
    "dynamic_filter": (
        '''\
def has_spread(args, samples, **kwargs):
    """Keep a group whose rewards differ: a group with one reward teaches GRPO nothing."""
    rewards = {s.reward for s in samples if isinstance(s.reward, int | float)}
    keep = len(rewards) > 1
    return DynamicFilterOutput(keep=keep, reason=None if keep else "no_spread")
''',
        "DynamicFilter",
        "rlsdk_dynamic_filters",
        "has_spread",
        "keep groups whose rewards differ",
    ),
    "over_sampling_filter": (
        '''\
def most_varied_first(args, groups, **kwargs):
    """Order the kept groups by the spread of their rewards, widest first."""

    def spread(group):
        rewards = [s.reward for s in group if isinstance(s.reward, int | float)]
        return max(rewards) - min(rewards) if rewards else 0.0

    return sorted(groups, key=spread, reverse=True)
''',
        "OverSamplingFilter",
        "rlsdk_over_sampling_filters",
        "most_varied_first",
        "groups with the widest reward spread first",
    ),
    "buffer_filter": (
        '''\
def newest_first(args, rollout_id, buffer, num_samples):
    """Serve up to ``num_samples`` groups from the buffer, the most recently added first; remove them."""
    return [buffer.pop() for _ in range(min(num_samples, len(buffer)))]
''',
        "BufferFilter",
        "rlsdk_buffer_filters",
        "newest_first",
        "serve the newest buffered groups first",
    ),
    "custom_generate": (
        '''\
async def one_turn(args, sample, sampling_params):
    """One model turn through the run's engine; add tool calls or an environment around it."""
    await model_turn(args, sample, sampling_params)
    return sample
''',
        "CustomGenerate",
        "rlsdk_custom_generates",
        "one_turn",
        "one model turn",
    ),
    "generate_rollout": (
        '''\
def default_step(args, rollout_id, data_source, evaluation=False):
    """rlsdk's own rollout step (over-sampling, filters, buffer): start here and change what you need."""
    return generate_rollout(args, rollout_id, data_source, evaluation)
''',
        "GenerateRollout",
        "rlsdk_generate_rollouts",
        "default_step",
        "rlsdk's rollout step",
    ),
    "environment": (
        '''\
def correct(args, sample, **kwargs):
    """1.0 when the last number in the response is the label; 0.0 otherwise."""
    numbers = re.findall(r"-?\\d+", sample.response)
    return float(bool(numbers) and numbers[-1] == str(sample.label).strip())


def brief(args, sample, **kwargs):
    """1.0 for a response of at most 20 words, falling to 0.0 at 60."""
    words = len(sample.response.split())
    return max(0.0, min(1.0, (60 - words) / 40))


def settings():
    """The environment: its data (inside this package), chat settings, rubric and eval set."""
    return {
        "prompt_data": package_file(__package__, "data/train.jsonl"),
        "label_key": "label",
        "apply_chat_template": True,
        "rm_type": "{package}_correct:0.9,{package}_brief:0.1",
        "rollout_max_response_len": 48,
        "eval_datasets": [{"name": "{package}-eval", "path": package_file(__package__, "data/eval.jsonl")}],
    }
''',
        "Environment",
        "rlsdk_environments",
        "settings",
        "two-number additions, graded by a rubric",
    ),
}
"""Per kind: the example function, its record class, its hook, the function's name, a description."""

ENVIRONMENT_REWARDS = (("correct", "the last number is the label"), ("brief", "short answers"))
"""The rewards the environment example's rubric weighs, registered with it."""
ENVIRONMENT_TRAINING = '{"num_rollout": 4, "rollout_batch_size": 4, "n_samples_per_prompt": 4, "lr": 1e-5}'
"""The example environment's options for ``--train`` only."""


def environment_rows(count: int, offset: int) -> str:
    """``count`` lines of JSONL additions (``input``, ``label``), deterministic, starting at ``offset``."""
    rows = []
    for i in range(offset, offset + count):
        a, b = i % 10, (3 * i + 1) % 10
        rows.append(f'{{"input": "What is {a} + {b}?", "label": "{a + b}"}}\n')
    return "".join(rows)


CHECKS = {
    "reward": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    samples = make_group([None, None], label="The answer is 1")  # responses "The answer is 0" and "... 1"
    assert check_reward(rlsdk_pm, "{record}", samples=samples) == [0.0, 1.0]
""",
    "dynamic_filter": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    groups = [make_group([0.0, 1.0]), make_group([1.0, 1.0])]
    verdicts = check_dynamic_filter(rlsdk_pm, "{record}", groups=groups)
    assert [v.keep for v in verdicts] == [True, False]
""",
    "over_sampling_filter": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    flat, wide = make_group([1.0, 1.0], group_index=0), make_group([0.0, 1.0], group_index=1)
    ordered = check_over_sampling_filter(rlsdk_pm, "{record}", groups=[flat, wide])
    assert ordered == [wide, flat]
""",
    "buffer_filter": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    taken = check_buffer_filter(rlsdk_pm, "{record}", num_samples=2)
    assert [g[0].group_index for g in taken] == [4, 3]
""",
    "custom_generate": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    sample = check_custom_generate(rlsdk_pm, "{record}", replies=["The answer is 5."])
    assert sample.response == "The answer is 5."
""",
    "generate_rollout": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    check_callable(rlsdk_pm, "generate_rollout", "{record}")
""",
    "environment": """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
    args = check_environment(rlsdk_pm, "{record}", train=True)
    assert args.label_key == "label" and args.eval_datasets
    samples = make_group([None, None], label="7")  # responses "The answer is 0" and "... 1"
    samples[0].response = "3 + 4 = 7"
    assert check_reward(rlsdk_pm, args.rm_type, args, samples=samples) == [1.0, 0.1]
""",
}

CHECK_IMPORTS = {
    "reward": ["check_reward", "make_group"],
    "dynamic_filter": ["check_dynamic_filter", "make_group"],
    "over_sampling_filter": ["check_over_sampling_filter", "make_group"],
    "buffer_filter": ["check_buffer_filter"],
    "custom_generate": ["check_custom_generate"],
    "generate_rollout": ["check_callable"],
    "environment": ["check_environment", "check_reward", "make_group"],
}


def record_name(package: str, kind: str) -> str:
    """The registered name of the package's example of ``kind``, prefixed so it clashes with no one's (the
    environment is the package's own name)."""
    return package if kind == "environment" else f"{package}_{EXAMPLES[kind][3]}"


def plugin_module(distribution: str, package: str, kinds: list[str]) -> str:
    records = sorted(
        {EXAMPLES[k][1] for k in kinds}
        | ({"DynamicFilterOutput"} if "dynamic_filter" in kinds else set())
        | ({"Reward", "package_file"} if "environment" in kinds else set())
    )
    lines = [
        f'"""The plugins of {distribution}: one example per kind; rename and change them."""',
        "",
        import_line(
            "rlsdk",
            [*(r for r in records if r[0].isupper()), "hookimpl", *(r for r in records if r[0].islower())],
        ),
    ]
    if "custom_generate" in kinds:
        lines.append("from rlsdk import model_turn")
    if "generate_rollout" in kinds:
        lines.append("from rlsdk.rollout.step import generate_rollout")
    if "environment" in kinds:
        lines[2:2] = ["import re", ""]
    for kind in kinds:
        lines += ["", "", EXAMPLES[kind][0].rstrip().replace("{package}", package)]
    yields: dict[str, list[str]] = {}  # hook -> the records it yields
    for kind in kinds:
        _, record, hook, func, description = EXAMPLES[kind]
        extra = f"        train_settings={ENVIRONMENT_TRAINING},\n" if kind == "environment" else ""
        yields.setdefault(hook, []).append(
            f'    yield {record}(\n        name="{record_name(package, kind)}",\n        func={func},\n'
            f'        description="{description}",\n{extra}    )'
        )
        if kind == "environment":
            yields.setdefault("rlsdk_rewards", []).extend(
                f'    yield Reward(name="{package}_{name}", func={name}, description="{text}")'
                for name, text in ENVIRONMENT_REWARDS
            )
    for hook, records in yields.items():
        lines += ["", "", "@hookimpl", f"def {hook}():", *records]
    return "\n".join(lines) + "\n"


LINE_LENGTH = 110
"""The generated package's line length (its pyproject sets ruff's to this)."""


def import_line(module: str, names: list[str]) -> str:
    """``from module import names`` as ruff formats it: one line, or one name a line when too long."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_LENGTH:
        return line
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")"


def test_module(package: str, kinds: list[str]) -> str:
    names = sorted({name for k in kinds for name in CHECK_IMPORTS[k]})
    lines = [
        f'"""{package}\'s plugins against rlsdk.testing\'s contract checks."""',
        "",
        import_line("rlsdk.testing", names),
        "",
        f"from {package} import plugin",
    ]
    for kind in kinds:
        lines += [
            "",
            "",
            CHECKS[kind].format(name=EXAMPLES[kind][3], record=record_name(package, kind)).rstrip(),
        ]
    return "\n".join(lines) + "\n"


def readme(distribution: str, package: str, kinds: list[str]) -> str:
    provided = "\n".join(f"- `{record_name(package, k)}` ({k}): {EXAMPLES[k][4]}" for k in kinds)
    option = {
        "reward": "--rm",
        "dynamic_filter": "--dynamic-filter",
        "over_sampling_filter": "--over-sampling-filter",
        "buffer_filter": "--buffer-filter",
        "custom_generate": "--custom-generate",
        "generate_rollout": "--rollout",
        "environment": "--env",
    }
    usage = " ".join(f"{option[k]} {record_name(package, k)}" for k in kinds)
    return f"""# {distribution}

An [rlsdk](https://pypi.org/project/rlsdk/) plugin. It provides:

{provided}

## Install and use

```bash
pip install -e .
rlsdk plugins list          # {distribution} and its names appear
rlsdk run {usage}
```

## Test

```bash
pip install -e ".[test]"
python -m pytest
```

The tests use `rlsdk.testing`'s contract checks (`check_reward`, `check_custom_generate`, ...) with an
isolated plugin manager holding only this package's plugins. The plugins are registered through the
entry point in `pyproject.toml` (`[project.entry-points.rlsdk]`); the hooks are in
`src/{package}/plugin.py`.
"""
