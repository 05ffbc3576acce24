"""``rlsdk plugins new NAME``: a plugin package that installs and passes its own tests as generated.

The package has a ``pyproject.toml`` with the ``rlsdk`` entry point, ``src/<package>/plugin.py`` with one
example per kind asked for, ``tests/`` using :mod:`rlsdk.testing`, and a README.
"""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from pathlib import Path

from rlsdk import KINDS, __version__
from rlsdk.plugins.kinds import RECORD_TYPES

SCAFFOLD_KINDS = KINDS
"""The kinds ``rlsdk plugins new --kind`` writes an example of: every kind (those without an example here get
their declaration's, :func:`declared_example`)."""


def rlsdk_floor() -> str:
    """The lowest rlsdk a new plugin declares: this minor version (``0.2``), with no upper bound. A public name
    that moves keeps working for a minor version with a DeprecationWarning, so a cap at the next minor would
    orphan a plugin that still runs; an upper bound belongs only at a known break."""
    return ".".join(__version__.split(".")[:2])


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
        "pyproject.toml": PYPROJECT.format(distribution=distribution, package=package, floor=rlsdk_floor()),
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
dependencies = ["rlsdk>={floor}"]

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
    return sglang_rollout(args, rollout_id, data_source, evaluation)
''',
        "GenerateRollout",
        "rlsdk_generate_rollouts",
        "default_step",
        "rlsdk's rollout step",
    ),
    "loss": (
        '''\
def reinforce(args, batch, logits, sum_of_sample_mean):
    """REINFORCE: minus each trained response token's advantage times its log-prob, averaged per sample
    (``sum_of_sample_mean``); ``batch`` holds per-sample tensors (``advantages``, ``loss_masks``, ...)."""
    import torch

    log_probs, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
    loss = -sum_of_sample_mean(torch.cat(log_probs) * torch.cat(batch["advantages"]))
    return loss, {"reinforce_loss": loss.detach()}  # shown as train/reinforce_loss
''',
        "Loss",
        "rlsdk_losses",
        "reinforce",
        "REINFORCE on the response tokens",
    ),
    "tool": (
        '''\
def word_count(args, query):
    """The number of words in ``query`` (a tag-style call <name>text</name> passes the text as it)."""
    return str(len(query.split()))
''',
        "Tool",
        "rlsdk_tools",
        "word_count",
        "count the words of a text",
    ),
    "agent": (
        '''\
async def ask_once(args, sample, client):
    """One chat turn through ``client`` (an ``openai.AsyncOpenAI`` bound to the sample's session: the
    tokens the model samples are recorded for training); the result lands in metadata["agent"]."""
    messages = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": sample.prompt}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    return {"answer": reply.choices[0].message.content}
''',
        "Agent",
        "rlsdk_agents",
        "ask_once",
        "answer in one chat turn",
    ),
    "trainer": (
        '''\
def counting_trainer(args):
    """rlsdk's torch trainer that also reports how many groups each step trained on; override
    ``train_step`` (or write a PolicyTrainer of your own) to change how it learns."""
    from rlsdk.trainer_api import TorchTrainer

    class Counting(TorchTrainer):
        def train_step(self, rollout_id, groups):
            metrics = super().train_step(rollout_id, groups)
            metrics["train/groups"] = len(groups)
            return metrics

    return Counting(args)
''',
        "Trainer",
        "rlsdk_trainers",
        "counting_trainer",
        "the torch trainer, counting groups",
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
EXAMPLES.update(
    {
        "task_generator": (
            '''\
def echo_answers(data):
    """A rollout-buffer task, started with the ``/start_rollout`` body ``data``: it writes
    ``num_repeat_per_sample`` trajectories for each of three questions to the buffer at ``remote_buffer_url``
    (run your agent or environment here)."""
    import httpx

    for i in range(3):
        for n in range(int(data.get("num_repeat_per_sample") or 1)):
            messages = [
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": str(i + 1)},
            ]
            item = {"instance_id": i, "uid": f"{i}-{n}", "messages": messages, "reward": 1.0}
            httpx.post(data["remote_buffer_url"] + "/buffer/write", json=item, timeout=30).raise_for_status()
''',
            "TaskGenerator",
            "rlsdk_task_generators",
            "echo_answers",
            "a rollout-buffer task writing answered questions",
        ),
        "megatron_init": (
            '''\
def seed_python(args):
    """Called once on every megatron trainer rank after megatron's initialisation, before the model is built."""
    import random

    random.seed(args.rollout_seed)
''',
            "MegatronInit",
            "rlsdk_megatron_inits",
            "seed_python",
            "seed Python's random module on every rank",
        ),
        "megatron_before_log_prob": (
            '''\
def eval_mode(args, model, store_prefix):
    """Before each log-prob computation (``store_prefix`` "" for the policy, "ref_" for the reference
    model): every model chunk in eval mode."""
    for chunk in model:
        chunk.eval()
''',
            "MegatronBeforeLogProb",
            "rlsdk_megatron_before_log_probs",
            "eval_mode",
            "model chunks in eval mode before log-probs",
        ),
        "megatron_before_train_step": (
            '''\
def lr_warmup(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """Before each optimizer step: the learning rate rises linearly over the first 10 rollouts."""
    for group in optimizer.param_groups:
        group["lr"] = args.lr * min(1.0, (rollout_id + 1) / 10)
''',
            "MegatronBeforeTrainStep",
            "rlsdk_megatron_before_train_steps",
            "lr_warmup",
            "a linear learning-rate warmup",
        ),
        "model_provider": (
            '''\
def local_gpt(pre_process, post_process, vp_stage=None, config=None, model_kwargs=None):
    """megatron-core's GPTModel with the local layer spec, from the trainer's ``config`` and ``model_kwargs``;
    the checkpoint's weights are loaded into it, so keep GPTModel's weight names."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=pre_process,
        post_process=post_process,
        **model_kwargs,
    )
''',
            "ModelProvider",
            "rlsdk_model_providers",
            "local_gpt",
            "GPTModel with megatron's local layer spec",
        ),
        "update_weight_post_write": (
            '''\
def list_files(args, version_dir, rollout_engines):
    """After a disk weight sync wrote ``version_dir``, before the engines read it: its file list is written
    beside it (publish the files to your shared store here)."""
    from pathlib import Path

    folder = Path(version_dir)
    (folder.parent / f"{folder.name}.files").write_text("\\n".join(sorted(p.name for p in folder.iterdir())))
''',
            "UpdateWeightPostWrite",
            "rlsdk_update_weight_post_writes",
            "list_files",
            "list the synced weight files",
        ),
    }
)
"""Per kind: the example function, its record class, its hook, the function's name, a description."""

ENVIRONMENT_REWARDS = (("correct", "the last number is the label"), ("brief", "short answers"))
"""The rewards the environment example's rubric weighs, registered with it."""
ENVIRONMENT_TRAINING = '{"num_rollout": 4, "rollout_batch_size": 4, "n_samples_per_prompt": 4, "lr": 1e-5}'
"""The example environment's options for ``--train`` only."""


def environment_rows(count: int, offset: int) -> str:
    """``count`` lines of JSONL single-digit additions (``input``, ``label``), rows ``offset`` to ``offset +
    count`` of a fixed order of the 100 distinct ones: row ranges that do not overlap share no problem (the
    eval set holds none of the training set's)."""
    if offset + count > 100:
        raise ValueError("there are 100 single-digit additions")
    rows = []
    for i in range(offset, offset + count):
        a, b = divmod((37 * i + 11) % 100, 10)  # 37 is prime to 100: each of the 100 problems once
        rows.append(f'{{"input": "What is {a} + {b}?", "label": "{a + b}"}}\n')
    return "".join(rows)


TEST_HEAD = """\
def test_{name}(rlsdk_pm):
    rlsdk_pm.register(plugin)
"""
"""How each generated test begins: the package's plugin registered in the fresh manager ``rlsdk_pm``."""

CHECKS = {
    "reward": """\
    samples = make_group([None, None], label="The answer is 1")  # responses "The answer is 0" and "... 1"
    assert check_reward(rlsdk_pm, "{record}", samples=samples) == [0.0, 1.0]
""",
    "dynamic_filter": """\
    groups = [make_group([0.0, 1.0]), make_group([1.0, 1.0])]
    verdicts = check_dynamic_filter(rlsdk_pm, "{record}", groups=groups)
    assert [v.keep for v in verdicts] == [True, False]
""",
    "over_sampling_filter": """\
    flat, wide = make_group([1.0, 1.0], group_index=0), make_group([0.0, 1.0], group_index=1)
    ordered = check_over_sampling_filter(rlsdk_pm, "{record}", groups=[flat, wide])
    assert ordered == [wide, flat]
""",
    "buffer_filter": """\
    taken = check_buffer_filter(rlsdk_pm, "{record}", num_samples=2)
    assert [g[0].group_index for g in taken] == [4, 3]
""",
    "custom_generate": """\
    sample = check_custom_generate(rlsdk_pm, "{record}", replies=["The answer is 5."])
    assert sample.response == "The answer is 5."
""",
    "generate_rollout": """\
    check_callable(rlsdk_pm, "generate_rollout", "{record}")
""",
    "environment": """\
    args = check_environment(rlsdk_pm, "{record}", train=True)
    assert args.label_key == "label" and args.eval_datasets
    samples = make_group([None, None], label="7")  # responses "The answer is 0" and "... 1"
    samples[0].response = "3 + 4 = 7"
    assert check_reward(rlsdk_pm, args.rm_type, args, samples=samples) == [1.0, 0.1]
""",
}
"""Per kind, its generated test after :data:`TEST_HEAD`: the kind's check on the example, and what it gives."""

CHECKS.update(
    {
        "loss": """\
    loss, metrics = check_loss(rlsdk_pm, "{record}")  # a small batch over uniform logits
    assert set(metrics) == {{"reinforce_loss"}}
""",
        "tool": """\
    tool = check_callable(rlsdk_pm, "tool", "{record}")
    assert tool.func(None, query="three short words") == "3"
""",
        "agent": """\
    # the signature only: running it needs a served model (rlsdk run --custom-generate openai_agent)
    check_callable(rlsdk_pm, "agent", "{record}")
""",
        "engine": """\
    # built, not started; a running engine is held to rlsdk.testing.ENGINE_CONTRACT by check_engine_contract
    engine = check_engine(rlsdk_pm, "{record}")
    assert engine.url == "http://10.0.0.5:30000"
""",
        "trainer": """\
    # the signature only: check_trainer(rlsdk_pm, name, args) trains a step on args.hf_checkpoint's model
    check_callable(rlsdk_pm, "trainer", "{record}")
""",
        "task_generator": """\
    body = {{"num_repeat_per_sample": 2}}  # the /start_rollout body (task_type added)
    items = check_task_generator(rlsdk_pm, "{record}", body)
    assert len(items) == 6  # three complete groups of two
""",
        "megatron_init": """\
    check_megatron_init(rlsdk_pm, "{record}")
""",
        "megatron_before_log_prob": """\
    # with one small torch module by default
    model = check_megatron_before_log_prob(rlsdk_pm, "{record}")
    assert not model[0].training
""",
        "megatron_before_train_step": """\
    # rollout 0 with the default lr, 1e-6
    _, optimizer = check_megatron_before_train_step(rlsdk_pm, "{record}")
    assert abs(optimizer.param_groups[0]["lr"] - 1e-7) < 1e-15
""",
        "model_provider": """\
    # the signature only: check_model_provider(rlsdk_pm, name, config=..., model_kwargs=...) builds it
    # where megatron-core is installed
    check_callable(rlsdk_pm, "model_provider", "{record}")
""",
        "update_weight_post_write": """\
    # a folder holding config.json by default
    folder = check_update_weight_post_write(rlsdk_pm, "{record}")
    assert (folder.parent / f"{{folder.name}}.files").read_text() == "config.json"
""",
    }
)

CHECK_IMPORTS = {
    "reward": ["check_reward", "make_group"],
    "dynamic_filter": ["check_dynamic_filter", "make_group"],
    "over_sampling_filter": ["check_over_sampling_filter", "make_group"],
    "buffer_filter": ["check_buffer_filter"],
    "custom_generate": ["check_custom_generate"],
    "generate_rollout": ["check_callable"],
    "loss": ["check_loss"],
    "tool": ["check_callable"],
    "agent": ["check_callable"],
    "engine": ["check_engine"],
    "trainer": ["check_callable"],
    "environment": ["check_environment", "check_reward", "make_group"],
    "task_generator": ["check_task_generator"],
    "megatron_init": ["check_megatron_init"],
    "megatron_before_log_prob": ["check_megatron_before_log_prob"],
    "megatron_before_train_step": ["check_megatron_before_train_step"],
    "model_provider": ["check_callable"],
    "update_weight_post_write": ["check_update_weight_post_write"],
}


def _declared_code(kind: str) -> tuple[str, ast.Module]:
    """The example code in ``kind``'s record docstring, parsed."""
    code = textwrap.dedent((RECORD_TYPES[kind].__doc__ or "").split(".. code-block:: python", 1)[1])
    return code, ast.parse(code)


def declared_example(kind: str) -> tuple[str, str, str, str, str]:
    """The example of a kind this module has none of, from its declaration: the function (or class) of the
    example in its record's docstring, its record, hook, name and description."""
    record = RECORD_TYPES[kind]
    code, tree = _declared_code(kind)
    func = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.name != record.hook_name()
    )
    source = ast.get_source_segment(code, func) or ""
    return source, record.__name__, record.hook_name(), func.name, f"an example {kind}: {func.name}"


def declared_imports(kinds: list[str]) -> tuple[set[str], list[str]]:
    """What the declared examples of ``kinds`` import: names from ``rlsdk``, and the other import lines."""
    names: set[str] = set()
    lines: list[str] = []
    for kind in kinds:
        if kind in EXAMPLES:
            continue
        code, tree = _declared_code(kind)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "rlsdk":
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                lines.append(ast.get_source_segment(code, node) or "")
    return names, sorted(set(lines))


def example(kind: str) -> tuple[str, str, str, str, str]:
    """Per kind: the example function, its record class, its hook, the function's name, a description."""
    return EXAMPLES.get(kind) or declared_example(kind)


DECLARED_CHECK = """\
    check_{kind}(rlsdk_pm, "{record}")  # called as a run calls it, on rlsdk.testing's default inputs
"""
"""The test (after :data:`TEST_HEAD`) of a kind whose example comes from its declaration: its kind's check in
:mod:`rlsdk.testing`."""


def record_name(package: str, kind: str) -> str:
    """The registered name of the package's example of ``kind``, prefixed so it clashes with no one's (the
    environment is the package's own name)."""
    return package if kind == "environment" else f"{package}_{example(kind)[3].lower()}"


def plugin_module(distribution: str, package: str, kinds: list[str]) -> str:
    helpers = {
        "dynamic_filter": ["DynamicFilterOutput"],
        "custom_generate": ["model_turn"],
        "loss": ["log_probs_and_entropy"],
        "environment": ["Reward", "package_file"],
        "generate_rollout": ["sglang_rollout"],
    }
    declared, imports = declared_imports(kinds)
    imports = sorted({*imports, *(["import re"] if "environment" in kinds else [])})
    names = {example(k)[1] for k in kinds} | {n for k in kinds for n in helpers.get(k, [])} | {"hookimpl"}
    names |= declared
    lines = [
        f'"""The plugins of {distribution}: one example per kind; rename and change them."""',
        "",
        *imports,
        *([""] if imports else []),
        import_line("rlsdk", sorted(names, key=lambda n: (n[0].islower(), n))),  # ruff's order: classes first
    ]
    for kind in kinds:
        lines += ["", "", example(kind)[0].rstrip().replace("{package}", package)]
    yields: dict[str, list[str]] = {}  # hook -> the records it yields
    for kind in kinds:
        _, record, hook, func, description = example(kind)
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
    names = sorted({name for k in kinds for name in CHECK_IMPORTS.get(k, [f"check_{k}"])})
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
            (TEST_HEAD + CHECKS.get(kind, DECLARED_CHECK))
            .format(name=example(kind)[3].lower(), record=record_name(package, kind), kind=kind)
            .rstrip(),
        ]
    return "\n".join(lines) + "\n"


def readme(distribution: str, package: str, kinds: list[str]) -> str:
    provided = "\n".join(f"- `{record_name(package, k)}` ({k}): {example(k)[4]}" for k in kinds)
    option = {
        "reward": "--rm",
        "dynamic_filter": "--dynamic-filter",
        "over_sampling_filter": "--over-sampling-filter",
        "buffer_filter": "--buffer-filter",
        "custom_generate": "--custom-generate",
        "generate_rollout": "--rollout",
        "loss": "--train --loss-type custom_loss --custom-loss-function-path",
        "tool": "--custom-generate multi_turn --set tool_names=",
        "agent": "--custom-generate openai_agent --set agent_function_path=",
        "trainer": "--train --trainer",
        "environment": "--env",
        "task_generator": "--rollout rollout_buffer --set rollout_task_type=",
        "megatron_init": "--train --trainer megatron --custom-megatron-init-path",
        "megatron_before_log_prob": "--train --trainer megatron --custom-megatron-before-log-prob-hook-path",
        "megatron_before_train_step": "--train --trainer megatron --custom-megatron-before-train-step-hook-path",
        "model_provider": "--train --trainer megatron --custom-model-provider-path",
        "update_weight_post_write": "--train --weight-sync disk --custom-update-weight-post-write-path",
    }
    for kind in set(kinds) - set(option):  # the others: the option the kind declares
        option[kind] = "--" + RECORD_TYPES[kind].options[0].name.replace("_", "-")
    usage = " ".join(
        f"{option[k]}{'' if option[k].endswith('=') else ' '}{record_name(package, k)}" for k in kinds
    )
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
