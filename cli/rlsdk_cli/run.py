"""``rlsdk run`` and ``rlsdk eval``: the main job, with slime's flag names accepted as aliases."""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import json
import os
import time
import typing
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rlsdk import RolloutConfig
from rlsdk.config import ALIASES
from rlsdk.errors import RlsdkError

from .flags import EVAL_UNUSED, eval_refusals, without_train_refusals

console = Console(stderr=True)


def fail(exc: BaseException) -> None:
    """Print ``Error: <exc>`` on stderr, the message as it is (``rlsdk[ray]`` is not markup)."""
    console.print(f"[red]Error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)


def build_config(config: Path | None, options: dict[str, Any], extra: list[str]) -> RolloutConfig:
    """The config file (if any), then every option given on the command line, then ``--set k=v``; an unknown
    key or a value of the wrong type, in any of them, is an error naming it."""
    return configure(config, options, extra)[0]


def configure(
    config: Path | None, options: dict[str, Any], extra: list[str], pm: Any = None
) -> tuple[RolloutConfig, set[str]]:
    """:func:`build_config` (its plugin options checked against ``pm``'s, default the installed plugins'), and
    the names of the options the file and the command line set (for the demo's defaults, which apply only to
    options not given, and the start-up summary). The file is read once."""
    overrides = given_overrides(options, extra)
    try:
        settings = RolloutConfig.read_file(config) if config is not None else {}
        try:
            args = RolloutConfig.from_dict({**settings, **overrides}, pm=pm)
        except ValueError as exc:
            raise ValueError(f"{config}: {exc}" if config is not None else str(exc)) from None
        given = {ALIASES.get(key.replace("-", "_"), key.replace("-", "_")) for key in [*overrides, *settings]}
        return args.with_default_data(given=given), given
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc)) from None


def resumed_config(
    config: Path | None, options: dict[str, Any], extra: list[str], pm: Any, guard: ExitStack, *, trust: bool
) -> tuple[RolloutConfig, set[str]]:
    """The configuration of the run saved in the output folder (the command line's, else the config file's),
    built once from its saved settings with the options given on the command line applied (only those
    ``--resume`` may change), and their names. The code the saved settings name is loaded only where this
    machine signed them, or named again here, or ``trust`` (``--trust-folder``): ``guard`` holds that
    refusal for the whole command."""
    from rlsdk.config import canonical_keys
    from rlsdk.plugins.loading import refusing_code
    from rlsdk.run.output import resume_refusals, resumed_settings
    from rlsdk.state_files import strings_in

    given_now = given_overrides(options, extra)  # --eval-data as eval_datasets: a resumed run may change them
    try:
        settings = canonical_keys(RolloutConfig.read_file(config)) if config is not None else {}
        folder = given_now.get("output_dir") or settings.get("output_dir") or RolloutConfig.output_dir
        refused = {} if trust else resume_refusals(folder, given_now)
        guard.enter_context(refusing_code(refused, allowed=strings_in(given_now)))
        args = RolloutConfig.from_dict(resumed_settings(folder, given_now), pm=pm)
    except (RlsdkError, ValueError, TypeError, FileNotFoundError) as exc:
        fail(exc)
        raise typer.Exit(1) from None
    return args, set(canonical_keys(given_now))


def given_overrides(options: dict[str, Any], extra: list[str]) -> dict[str, Any]:
    """The options the command line gives (``--set`` included), JSON options parsed, ``--eval-data`` as
    ``eval_datasets``."""
    overrides = {k: v for k, v in options.items() if v is not None and v != []}
    overrides.update(parse_set(extra))
    for name, value in overrides.items():
        if isinstance(value, str) and name in DICT_OPTIONS:
            overrides[name] = json.loads(value)
    eval_data = overrides.pop("eval_data", [])
    if eval_data:
        overrides["eval_datasets"] = [eval_dataset(d) for d in eval_data]
    return overrides


def eval_dataset(value: str) -> dict[str, str]:
    """One ``--eval-data``: ``NAME=PATH``, a data file's path (named by its stem) or the name of a shipped
    dataset (``arithmetic-eval``); anything else is an error listing the shipped names."""
    from rlsdk.config import shipped_datasets

    name, sep, path = value.partition("=")
    if sep:
        if not name or not path:
            raise typer.BadParameter(f"--eval-data takes NAME=PATH, got {value!r}")
        return {"name": name, "path": path}
    shipped = shipped_datasets()
    if value in shipped:
        return {"name": value, "path": str(shipped[value])}
    if Path(value.split("@[", 1)[0]).is_file():
        return {"name": Path(value.split("@[", 1)[0]).stem, "path": value}
    raise typer.BadParameter(
        f"--eval-data {value!r} is not NAME=PATH, a data file or a shipped dataset "
        f"(shipped: {', '.join(sorted(shipped))})"
    )


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs; values are JSON where they parse as JSON, else strings."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set takes KEY=VALUE, got {item!r}")
        try:
            values[key] = json.loads(value)
        except json.JSONDecodeError:
            values[key] = value
    return values


SPECIAL_FLAGS = {"apply_chat_template": ("--apply-chat-template/--no-chat-template",)}
"""Options whose command-line form is not ``--`` and the name (or a short name of :data:`rlsdk.config.ALIASES`)."""
NOT_FLAGS = frozenset({"resume", "overwrite", "sglang_router_ip", "sglang_router_port", "eval_datasets"})
"""Options the command line does not take: ``--resume`` and ``--overwrite`` are the command's own, the engine sets the router's
address, and eval datasets come as ``--eval-data NAME=PATH``."""
DICT_OPTIONS = frozenset({"apply_chat_template_kwargs", "multimodal_keys", "ray_runtime_env"})
"""Options given as JSON on the command line."""


def _common(
    config: Path | None = typer.Option(None, "--config", help="YAML, TOML or JSON file of options."),
    eval_data: list[str] = typer.Option([], "--eval-data", help="NAME=PATH of an eval dataset (repeatable)."),
    extra: list[str] = typer.Option([], "--set", help="KEY=VALUE for any option, plugins' own included."),
) -> None:
    """The options of ``rlsdk run`` and ``rlsdk eval`` that are not run options themselves."""


def option_parameters(unused: frozenset[str] = frozenset()) -> list[inspect.Parameter]:
    """One command-line option per run option, ``unused`` ones hidden: core's (:func:`rlsdk.config.core_options`, from
    RolloutConfig's fields and docstrings) and those the installed plugins declare, each with its help and
    default."""
    from rlsdk.config import core_options, installed_plugin_options
    from rlsdk.options import SECTIONS

    panels = {
        f.name: title.title() for title, section in SECTIONS.items() for f in dataclasses.fields(section)
    }
    hints = typing.get_type_hints(RolloutConfig)
    params = []
    for name, option in core_options().items():
        if name not in NOT_FLAGS:  # an unused one is hidden, taken only to be refused by name
            params.append(_parameter(option, panels.get(name, "Plugins"), hints.get(name), name in unused))
    try:
        declared = installed_plugin_options()
    except RlsdkError:  # two plugins declaring one option differently: `rlsdk run` itself says so
        declared = {}
    for name, (option, info) in sorted(declared.items()):
        params.append(_parameter(option, f"Plugin options ({info.distribution or info.plugin})", None))
    return params


def _parameter(option: Any, panel: str, hint: Any, hidden: bool = False) -> inspect.Parameter:
    default = option.default
    unset = default is None or default is False or default == [] or default == {}
    choices = f" One of: {', '.join(map(str, option.choices))}." if option.choices else ""
    help_text = escape((option.help or "") + choices + ("" if unset else f" (default: {default})"))
    names = [short for short, name in ALIASES.items() if name == option.name] + [option.name]
    flags = SPECIAL_FLAGS.get(option.name) or tuple("--" + n.replace("_", "-") for n in names)
    if option.type is list:
        items = [a for a in typing.get_args(hint) if a is not type(None)] if hint is not None else []
        item = (typing.get_args(items[0]) or (str,))[0] if items else str
        return inspect.Parameter(
            option.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=typing.cast(Any, list)[item],
            default=typer.Option(
                [], *flags, help=help_text + " (repeatable)", rich_help_panel=panel, hidden=hidden
            ),
        )
    kind = str if option.type is dict else option.type
    return inspect.Parameter(
        option.name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=typing.Optional[kind],  # noqa: UP045 (typer needs Optional)
        default=typer.Option(None, *flags, help=help_text, rich_help_panel=panel, hidden=hidden),
    )


def with_run_options(func: Any = None, *, unused: frozenset[str] = frozenset()) -> Any:
    """Give a command ``--config``, ``--eval-data``, ``--set`` and one option per run option, ``unused`` ones
    hidden from its help (typer reads the signature), passed as ``**options``."""
    if func is None:
        return lambda f: with_run_options(f, unused=unused)
    hints = {**typing.get_type_hints(_common), **typing.get_type_hints(func)}
    own = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    params = [
        p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
        for p in own + list(inspect.signature(_common).parameters.values())
    ]
    func.__signature__ = inspect.Signature(params + option_parameters(unused))
    return func


def sglang_passthrough_options(tokens: list[str], known: list[str]) -> list[str]:
    """Unknown ``--sglang-NAME [VALUE...]`` and ``--router-NAME [VALUE...]`` flags as ``sglang_NAME=VALUE``
    and ``router_NAME=VALUE`` settings, and slime's arguments rlsdk keeps for slime's functions
    (``--attention-backend flash``, ``--balance-data``: :data:`rlsdk.slime_args.SLIME_ARG_DEFAULTS`) as
    theirs (a bare flag is true, several values a list); any other unknown token is the parser's usual
    error, with the ``known`` option closest to it."""
    from rlsdk.config import slime_argument_names

    slime = slime_argument_names()
    settings: dict[str, list[Any]] = {}
    name = None
    for token in tokens:
        slime_name = token[2:].partition("=")[0].replace("-", "_") if token.startswith("--") else ""
        if token.startswith(("--sglang-", "--router-")) or slime_name in slime:
            key, sep, value = token[2:].partition("=")
            name = key.replace("-", "_")
            settings[name] = [value] if sep else []
        elif name is not None and not token.startswith("--"):
            settings[name].append(token)
        else:
            import difflib

            flag = token.split("=", 1)[0]
            raise typer.BadParameter(
                f"no such option {flag}"
                + "".join(
                    f" (did you mean {close}?)" for close in difflib.get_close_matches(flag, known, n=1)
                )
            )
    parsed = {k: [parse_set([f"v={v}"])["v"] for v in values] for k, values in settings.items()}
    return [f"{k}={json.dumps(True if not v else v[0] if len(v) == 1 else v)}" for k, v in parsed.items()]


MALLOC_ARENAS = 2
M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter number for the arena cap (malloc.h)."""


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas at :data:`MALLOC_ARENAS`, unless ``MALLOC_ARENA_MAX`` is set. glibc gives
    threads arenas of their own (up to 8 per core) and memory freed in one is not reused by another, so a
    ``--train`` run's resident memory grew past its live tensors: the demo peaked at 6.04 GB by its fifth
    step with the default, 4.48 GB with two arenas, at the same speed. False where libc is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, MALLOC_ARENAS))


@with_run_options
def run(
    context: typer.Context,
    resume: bool = typer.Option(False, "--resume", help="Continue the run saved in the output folder."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run in the output folder."),
    trust_folder: bool = typer.Option(
        False,
        "--trust-folder",
        help="With --resume: load the code the saved state names although this machine did not write it "
        "(a run folder copied from another machine); the state is signed here from then on.",
    ),
    print_config: bool = typer.Option(
        False,
        "--print-config",
        help="Print every setting of the run as YAML (each not at its default with where it comes from: given, "
        "or set by the demo) and exit; the output works as --config.",
    ),
    **options: Any,
) -> None:
    """Run rollout steps: with no options, the embedded engine on SmolLM2-135M and the shipped math data."""
    from .settings import config_yaml, setting_sources, summary_lines

    if resume and overwrite:
        raise typer.BadParameter(
            "--resume continues the run in the output folder, --overwrite replaces it: give one"
        )
    if trust_folder and not resume:
        raise typer.BadParameter("--trust-folder applies only with --resume (it trusts a saved run's code)")
    limit_malloc_arenas()  # before the engine's and the trainer's threads allocate
    guard = ExitStack()  # the resumed state's code refusals, for the whole command
    context.call_on_close(guard.close)
    known = [flag for param in context.command.params for flag in param.opts]
    extra = options.pop("extra") + sglang_passthrough_options(context.args, known)
    config = options.pop("config")
    from rlsdk import get_plugin_manager
    from rlsdk.run.job import run_job
    from rlsdk.run.preemption import RunStopped

    pm = get_plugin_manager()  # the run's one manager: its options checked, its plugins resolved
    if resume:
        args, given = resumed_config(config, options, extra, pm, guard, trust=trust_folder)
    else:
        args, given = configure(config, {**options, "overwrite": overwrite or None}, extra, pm)
    if not args.train:  # a training option on the command line of a run that does not train does nothing
        refused = without_train_refusals(command_line_names(options, extra))
        if refused:
            raise typer.BadParameter("; ".join(refused))
    sources = setting_sources(args, given, pm=pm, resumed=resume)
    if print_config:
        typer.echo(config_yaml(args, sources), nl=False)
        return
    console.print("\n".join(summary_lines(args, sources)), markup=False, highlight=False, soft_wrap=True)
    from rlsdk.slime_args import SLIME_TRAINER_SETTINGS

    unused = sorted(name for name in args.extra if name in SLIME_TRAINER_SETTINGS)
    if unused:
        console.print(
            f"slime's trainer settings taken as given, used by none of rlsdk's trainers: {', '.join(unused)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if resume and finished_run(args):
        console.print(
            f"the run in {args.output_dir} is finished ({args.num_rollout} of {args.num_rollout} steps): "
            "--resume --num-rollout N continues it to N steps",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    if not console.is_terminal:  # no download or loading bars redrawn line after line in a log
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")

    samples_per_step = args.rollout_batch_size * args.n_samples_per_prompt
    # Each refresh renders the bar in a thread that holds the GIL meanwhile; at rich's default 10 per
    # second that slowed the embedded engine's CUDA-graph steps by about 5% on an H100. Not drawn at all
    # where nobody sees it (stderr is not a terminal).
    progress = Progress(
        TextColumn("[bold]{task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=2,
        disable=not console.is_terminal,
    )
    task = progress.add_task("rollout", total=samples_per_step, status="setting up")

    lines = ProgressLines()

    def on_status(text: str) -> None:
        """Steps are numbered as in the tables and metrics.jsonl (the rollout_id); set-up is printed. An
        eval counts its samples without a total (each dataset's size is known only once it is read)."""
        lines.reset(text)
        if text.startswith("step ") and text[5:].isdigit():
            step = int(text[5:])
            status = f"{text} ({step + 1} of {args.num_rollout})"
            progress.reset(task, total=samples_per_step, status=escape(status))
        else:
            if text.startswith("eval "):
                progress.reset(task, total=None)
            progress.update(task, status=escape(text))
            console.print(f"[dim]{escape(text)}[/dim]", highlight=False)

    def on_progress(samples: int) -> None:
        progress.advance(task, samples)
        if not console.is_terminal:  # no bar: a line now and then
            lines.advance(samples)

    def on_step(rollout_id: int, metrics: dict[str, Any]) -> None:
        console.print(step_table(rollout_id, metrics))

    def on_eval(rollout_id: int, metrics: dict[str, Any]) -> None:
        when = "before training" if rollout_id < 0 else f"after step {rollout_id}"
        console.print(metrics_table(f"eval {when}", metrics))

    try:
        with progress:
            output = run_job(
                args,
                pm,
                on_step=on_step,
                on_eval=on_eval,
                on_status=on_status,
                progress=on_progress,
                trust_folder=trust_folder,
            )
    except (RlsdkError, ValueError, FileNotFoundError) as exc:
        fail(exc)
        raise typer.Exit(1) from None
    except RunStopped as exc:  # SIGTERM or SIGINT: the state and a checkpoint are saved
        console.print(
            f"{exc.signal_name}: stopped; continue with: rlsdk run --resume --output {args.output_dir}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        console.print(
            f"interrupted; continue with: rlsdk run --resume --output {args.output_dir}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    from rlsdk.run.summary import run_summary

    console.print("\n".join(run_summary(args, output.folder)), markup=False, highlight=False, soft_wrap=True)
    for finding in output.findings:  # the detectors' warnings, repeated where they are seen
        console.print(
            f"warning ({finding['detector']}): {finding['message']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"wrote {output.folder}/rollouts.jsonl, metrics.jsonl and state.json", markup=False, highlight=False
    )
    console.print(
        f"see the curves, steps and samples: rlsdk view {output.folder}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@with_run_options(unused=EVAL_UNUSED)
def evaluate(
    print_config: bool = typer.Option(
        False,
        "--print-config",
        help="Print every setting of the eval as YAML (each not at its default with where it comes from) and "
        "exit; the output works as --config.",
    ),
    **options: Any,
) -> None:
    """Evaluate the model (a model folder, or a checkpoint of ``rlsdk run --train``, a LoRA adapter's
    included) once on the eval datasets: those given, else the checkpoint's run's, else the environment's
    held-out set, else the training data."""
    from rlsdk import get_plugin_manager
    from rlsdk.plugins.loading import refusing_code

    from .settings import (
        checkpoint_refusals,
        config_yaml,
        lora_checkpoint,
        setting_sources,
        with_checkpoint_settings,
    )

    extra = options.pop("extra")
    config = options.pop("config")
    not_used = eval_refusals(command_line_names(options, extra))
    if not_used:
        raise typer.BadParameter("; ".join(not_used))
    pm = get_plugin_manager()  # the eval's one manager: its options checked, its plugins resolved
    args, given = configure(config, options, extra, pm)
    args, taken = with_checkpoint_settings(args, given)
    refused = checkpoint_refusals(args, taken)  # code a checkpoint from elsewhere names is not loaded
    try:
        args, adapter = lora_checkpoint(args)
        args, scored = eval_sets(args, pm)
    except (RlsdkError, ValueError) as exc:
        fail(exc)
        raise typer.Exit(1) from None
    if print_config:
        typer.echo(config_yaml(args, setting_sources(args, given)), nl=False)
        return
    if taken:
        console.print(
            f"from the checkpoint's run: {', '.join(taken)}", markup=False, highlight=False, soft_wrap=True
        )
    console.print(
        "\n".join(eval_summary(args, adapter, scored)), markup=False, highlight=False, soft_wrap=True
    )
    from rlsdk.run.extensions import log_eval
    from rlsdk.run.job import run_eval
    from rlsdk.run.output import RunOutput
    from rlsdk.run.session import running

    try:
        with refusing_code(refused), running(args, pm) as runtime:
            assert runtime.args is not None
            if adapter is not None:  # served over its base model, as the run's engine served it
                runtime.run(runtime.engine.load_lora_adapter(adapter.name, str(adapter)))
            result = run_eval(runtime.args, runtime, rollout_id=0)
            log_eval(runtime.args, runtime, 0, result)  # --eval-rollout-log, as after a run's evals
    except (RlsdkError, ValueError, FileNotFoundError) as exc:
        fail(exc)
        raise typer.Exit(1) from None
    Console().print(metrics_table("eval", result.metrics))
    if options["output_dir"] is not None:  # appended, so an eval beside a run's own evals keeps both
        output = RunOutput(args.output_dir)
        output.write_eval(0, result)
        console.print(
            f"wrote {output.folder}/eval.jsonl and eval_samples.jsonl", markup=False, highlight=False
        )
    typer.echo(json.dumps(result.metrics))


def eval_sets(args: RolloutConfig, pm: Any) -> tuple[RolloutConfig, str]:
    """``args`` with the eval datasets ``rlsdk eval`` scores, and where they come from: those set (given, or
    the checkpoint's run's), else the environment's held-out set (what its training runs evaluate on), else
    the training data."""
    from rlsdk.config import environment_options

    if args.eval_datasets or args.eval_prompt_data or args.eval_config:
        return args, "set"
    env = args.choices.get("env")
    held_out = environment_options(env, pm, train=True).get("eval_datasets") if env else None
    if held_out:
        return args.replace(eval_datasets=held_out), f"the held-out set of the environment {env!r}"
    data = str(args.prompt_data)  # with_default_data set it
    return args.replace(eval_datasets=[{"name": Path(data).stem, "path": data}]), (
        "the training data: no --eval-data is given"
    )


def eval_summary(args: RolloutConfig, adapter: Path | None, scored: str) -> list[str]:
    """What ``rlsdk eval`` scores: the model, the data sets, the samples per prompt and the reward."""
    from rlsdk import Reward
    from rlsdk.data.eval_sets import run_eval_datasets

    model = args.model or "the default model (SmolLM2-135M-Instruct)"
    with_adapter = f" with the LoRA adapter {adapter}" if adapter is not None else ""
    reward = Reward.chosen(args)
    lines = [
        f"eval: {model}{with_adapter}, reward {reward}, {args.n_samples_per_eval_prompt} sample(s) per prompt"
    ]
    where = "" if scored == "set" else f" ({scored})"
    for dataset in run_eval_datasets(args):
        lines.append(f"  data {dataset.name} = {dataset.path}{where}")
    lines.append("  (every setting: the same command with --print-config)")
    return lines


def command_line_names(options: dict[str, Any], extra: list[str]) -> set[str]:
    """The run options the command line sets: its flags and ``--set`` keys, by their canonical names."""
    names = [k for k, v in options.items() if v is not None and v != []]
    names += [k.replace("-", "_") for k in parse_set(extra)]
    return {ALIASES.get(name, name) for name in names}


def finished_run(args: RolloutConfig) -> bool:
    """Whether the run saved in the output folder has done its ``num_rollout`` steps already."""
    from rlsdk.outputs import STATE_FILE

    state = json.loads((Path(args.output_dir) / STATE_FILE).read_text())
    return int(state["next_rollout_id"]) >= args.num_rollout


class ProgressLines:
    """Progress where no bar is drawn (stderr is not a terminal): a line at most every ``every`` seconds with
    the samples done so far in what the run is doing."""

    def __init__(self, every: float = 30.0) -> None:
        self.every = every
        self.reset("setting up")

    def reset(self, status: str) -> None:
        self.status, self.done = status, 0
        self.started = self.shown = time.monotonic()

    def advance(self, samples: int) -> None:
        self.done += samples
        now = time.monotonic()
        if now - self.shown >= self.every:
            self.shown = now
            console.print(
                f"{self.status}: {self.done} samples done in {now - self.started:.0f} s",
                markup=False,
                highlight=False,
            )


def step_table(rollout_id: int, metrics: dict[str, Any]) -> Group:
    """The step's rollout row (and a line with the drop reasons and aborts, which a column would cut at 80
    columns), and with ``--train`` its train row; a rollout function that reports no ledger (a slime-style
    bare list) shows ``-``."""
    parts = [
        f"{k.removeprefix('rollout/dynamic_filter/drop_')} {v}"
        for k, v in metrics.items()
        if k.startswith("rollout/dynamic_filter/drop_")
    ]
    notes = "; ".join(
        filter(
            None,
            [
                f"dropped: {', '.join(parts)}" if parts else "",
                f"aborted {metrics['rollout/aborted']}" if metrics.get("rollout/aborted") else "",
            ],
        )
    )
    rollout: list[Any] = [row_table(f"step {rollout_id}", metrics, ROLLOUT_COLUMNS)]
    if notes:
        rollout.append(Text(notes, overflow="fold"))
    if not any(key in metrics for _, key, _ in TRAIN_COLUMNS):
        return Group(*rollout)
    return Group(*rollout, row_table(f"step {rollout_id}: train", metrics, TRAIN_COLUMNS))


ROLLOUT_COLUMNS = (
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("all", "rollout/reward_mean_before_filter", "{:.3f}"),
    ("sd", "rollout/reward_group_std_mean", "{:.3f}"),
    ("kept", "ledger/kept", "{}"),
    ("dropped", "ledger/dropped", "{}"),
    ("returned", "ledger/returned", "{}"),
    ("failed", "ledger/failed", "{}"),
    ("tok/s", "rollout/tokens_per_s", "{:.0f}"),
    ("s", "rollout/seconds", "{:.1f}"),
)
"""``reward``: the kept samples' mean; ``all``: every scored sample's, before the filters; ``sd``: the
mean over those groups of their rewards' standard deviation (0 in a group gives GRPO nothing to learn)."""
TRAIN_COLUMNS = (
    ("loss", "train/loss", "{:.4f}"),
    ("KL", "train/kl_loss", "{:.4f}"),
    ("entropy", "train/entropy_loss", "{:.3f}"),
    ("clip", "train/pg_clipfrac", "{:.3f}"),
    ("grad norm", "train/grad_norm", "{:.3f}"),
    ("train s", "train/seconds", "{:.1f}"),
    ("sync s", "train/sync_seconds", "{:.2f}"),
)


def row_table(title: str, metrics: dict[str, Any], columns: tuple[tuple[str, str, str], ...]) -> Table:
    table = Table(title=title, show_header=True)
    cells = []
    for name, key, fmt in columns:
        table.add_column(name, justify="right")
        value = metrics.get(key)
        cells.append("-" if value is None else fmt.format(value))
    table.add_row(*cells)
    return table


def metrics_table(title: str, metrics: dict[str, Any]) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    return table
