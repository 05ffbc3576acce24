"""``rlsdk run`` and ``rlsdk eval``: the main job, with slime's flag names accepted as aliases."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import typing
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rlsdk import RolloutConfig
from rlsdk.errors import RlsdkError

console = Console(stderr=True)

PLUGIN_HELP = "A registered name (see `rlsdk plugins list`) or a dotted path pkg.mod:fn."


def build_config(config: Path | None, options: dict[str, Any], extra: list[str]) -> RolloutConfig:
    """The config file (if any), then every option given on the command line, then ``--set k=v``."""
    overrides = {k: v for k, v in options.items() if v is not None and v != []}
    overrides.update(parse_set(extra))
    if isinstance(overrides.get("apply_chat_template_kwargs"), str):
        overrides["apply_chat_template_kwargs"] = json.loads(overrides["apply_chat_template_kwargs"])
    eval_data = overrides.pop("eval_data", [])
    if eval_data:
        overrides["eval_datasets"] = [dict(zip(("name", "path"), d.split("=", 1), strict=True)) for d in eval_data]
    try:
        if config is not None:
            args = RolloutConfig.from_file(config, **overrides)
        else:
            args = RolloutConfig.from_dict(overrides)
        return args.with_default_data(given=set(overrides) | set(file_keys(config)))
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(str(exc)) from None


def file_keys(config: Path | None) -> list[str]:
    """The option names a config file sets (for the demo defaults, which apply only to options not given)."""
    if config is None:
        return []
    return [key.replace("-", "_") for key in RolloutConfig.read_file(config)]


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


def _options(
    config: Path | None = typer.Option(None, "--config", help="YAML, TOML or JSON file of options."),
    rollout_function_path: str | None = typer.Option(None, "--rollout", "--rollout-function-path",
                                                     help=f"generate_rollout. {PLUGIN_HELP}"),
    eval_function_path: str | None = typer.Option(None, "--eval-rollout", "--eval-function-path",
                                                  help="generate_rollout for eval."),
    custom_generate_function_path: str | None = typer.Option(
        None, "--custom-generate", "--custom-generate-function-path", help=f"custom_generate. {PLUGIN_HELP}"),
    rm_type: str | None = typer.Option(None, "--rm", "--rm-type", help=f"reward. {PLUGIN_HELP}"),
    custom_rm_path: str | None = typer.Option(None, "--custom-rm-path", help="A reward by dotted path."),
    group_rm: bool | None = typer.Option(None, "--group-rm", help="The dotted-path reward scores whole groups."),
    rm_url: str | None = typer.Option(None, "--rm-url", help="URL of the remote reward."),
    reward_key: str | None = typer.Option(None, "--reward-key", help="Key of dict rewards for training."),
    eval_reward_key: str | None = typer.Option(None, "--eval-reward-key", help="Key of dict rewards for eval."),
    on_invalid_reward: str | None = typer.Option(None, "--on-invalid-reward",
                                                 help="fail, drop_group or score (with --invalid-reward-value)."),
    invalid_reward_value: float | None = typer.Option(None, "--invalid-reward-value"),
    dynamic_sampling_filter_path: str | None = typer.Option(
        None, "--dynamic-filter", "--dynamic-sampling-filter-path", help=f"dynamic_filter. {PLUGIN_HELP}"),
    over_sampling_filter_path: str | None = typer.Option(
        None, "--over-sampling-filter", "--over-sampling-filter-path", help=f"over_sampling_filter. {PLUGIN_HELP}"),
    buffer_filter_path: str | None = typer.Option(None, "--buffer-filter", "--buffer-filter-path",
                                                  help=f"buffer_filter. {PLUGIN_HELP}"),
    engine: str | None = typer.Option(None, "--engine", help="embedded, sglang, an engine plugin, or a URL."),
    model: str | None = typer.Option(None, "--model", help="Local Hugging Face model folder for the embedded engine."),
    hf_checkpoint: str | None = typer.Option(None, "--hf-checkpoint", help="Tokenizer folder (for URL engines)."),
    prompt_data: str | None = typer.Option(None, "--data", "--prompt-data", help="JSONL or Parquet[@[a:b]]."),
    input_key: str | None = typer.Option(None, "--input-key"),
    label_key: str | None = typer.Option(None, "--label-key"),
    metadata_key: str | None = typer.Option(None, "--metadata-key"),
    tool_key: str | None = typer.Option(None, "--tool-key"),
    apply_chat_template: bool | None = typer.Option(None, "--apply-chat-template/--no-chat-template"),
    apply_chat_template_kwargs: str | None = typer.Option(None, "--apply-chat-template-kwargs", help="JSON."),
    rollout_max_prompt_len: int | None = typer.Option(None, "--rollout-max-prompt-len"),
    rollout_shuffle: bool | None = typer.Option(None, "--rollout-shuffle"),
    rollout_seed: int | None = typer.Option(None, "--rollout-seed", "--seed"),
    num_rollout: int | None = typer.Option(None, "--num-rollout", help="Steps to run."),
    rollout_batch_size: int | None = typer.Option(None, "--rollout-batch-size", help="Groups kept per step."),
    n_samples_per_prompt: int | None = typer.Option(None, "--n-samples-per-prompt"),
    over_sampling_batch_size: int | None = typer.Option(None, "--over-sampling-batch-size"),
    rollout_max_response_len: int | None = typer.Option(None, "--rollout-max-response-len", "--max-new-tokens"),
    rollout_temperature: float | None = typer.Option(None, "--rollout-temperature", "--temperature"),
    rollout_top_p: float | None = typer.Option(None, "--rollout-top-p", "--top-p"),
    rollout_top_k: int | None = typer.Option(None, "--rollout-top-k", "--top-k"),
    rollout_stop: list[str] = typer.Option([], "--rollout-stop", help="Stop string (repeatable)."),
    rollout_stop_token_ids: list[int] = typer.Option([], "--rollout-stop-token-ids", help="Repeatable."),
    sglang_enable_deterministic_inference: bool | None = typer.Option(
        None, "--deterministic", "--sglang-enable-deterministic-inference", help="Seed sample i with seed + i."),
    sglang_server_concurrency: int | None = typer.Option(None, "--sglang-server-concurrency"),
    partial_rollout: bool | None = typer.Option(None, "--partial-rollout"),
    mask_offpolicy_in_partial_rollout: bool | None = typer.Option(None, "--mask-offpolicy-in-partial-rollout"),
    eval_data: list[str] = typer.Option([], "--eval-data", help="NAME=PATH of an eval dataset (repeatable)."),
    eval_prompt_data: list[str] = typer.Option([], "--eval-prompt-data", help="slime's flat NAME PATH pairs."),
    n_samples_per_eval_prompt: int | None = typer.Option(None, "--n-samples-per-eval-prompt"),
    eval_interval: int | None = typer.Option(None, "--eval-interval", help="Eval every N steps."),
    output_dir: str | None = typer.Option(None, "--output", "--output-dir", help="Output folder."),
    extra: list[str] = typer.Option([], "--set", help="KEY=VALUE for any option, plugins' own included."),
) -> dict[str, Any]:
    """The options shared by ``rlsdk run`` and ``rlsdk eval``; parameter names are RolloutConfig's."""
    return dict(locals())


def training_options() -> list[inspect.Parameter]:
    """One ``--kebab-case`` option per field of :class:`~rlsdk.training.options.TrainingOptions`, with the
    field's docstring as help: the training options' single source."""
    from rlsdk.training.options import TrainingOptions, option_docs

    docs = option_docs()
    hints = typing.get_type_hints(TrainingOptions)
    params = []
    for field in dataclasses.fields(TrainingOptions):
        annotation = hints[field.name]
        base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        default = f" \\[default: {field.default}]" if field.default not in (None, False) else ""
        option = typer.Option(None, "--" + field.name.replace("_", "-"), help=docs.get(field.name, "") + default,
                              rich_help_panel="Training")
        params.append(inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=typing.Optional[base]))  # noqa: UP045 (typer needs Optional)
    return params


def with_default_in_help(param: inspect.Parameter) -> inspect.Parameter:
    """An option left None on the command line (so a config file can set it) with RolloutConfig's default
    in its ``--help`` text."""
    field = next((f for f in dataclasses.fields(RolloutConfig) if f.name == param.name), None)
    option = param.default
    if field is None or field.default in (None, False, dataclasses.MISSING) or not isinstance(
            option, typer.models.OptionInfo):
        return param
    option = copy.copy(option)  # run and eval share _options' defaults
    option.help = f"{option.help or ''} \\[default: {field.default}]".strip()  # escaped: rich markup
    return param.replace(default=option)


def with_run_options(func: Any) -> Any:
    """Give a command every option of :func:`_options` and the training options (typer reads the
    signature), passed as ``**options``."""
    hints = {**typing.get_type_hints(_options), **typing.get_type_hints(func)}
    own = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    params = [p.replace(annotation=hints[p.name])
              for p in own + list(inspect.signature(_options).parameters.values())]
    keyword = [with_default_in_help(p.replace(kind=inspect.Parameter.KEYWORD_ONLY)) for p in params]
    func.__signature__ = inspect.Signature(keyword + training_options())
    return func


@with_run_options
def run(
    resume: bool = typer.Option(False, "--resume", help="Continue the run saved in the output folder."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run in the output folder."),
    **options: Any,
) -> None:
    """Run rollout steps: with no options, the embedded engine on SmolLM2-135M and the shipped math data."""
    extra = options.pop("extra")
    args = build_config(options.pop("config"), {**options, "resume": resume or None,
                                                "overwrite": overwrite or None}, extra)
    from rlsdk.job import resumed_settings, run_job

    if resume:
        given = {k: v for k, v in options.items() if v is not None and v != []}
        try:
            args = RolloutConfig.from_dict(resumed_settings(args.output_dir, {**given, **parse_set(extra)}))
        except (ValueError, TypeError, FileNotFoundError) as exc:
            console.print(f"[red]Error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    samples_per_step = args.rollout_batch_size * args.n_samples_per_prompt
    # Each refresh renders the bar in a thread that holds the GIL meanwhile; at rich's default 10 per
    # second that slowed the embedded engine's CUDA-graph steps by about 5% on an H100. Not drawn at all
    # where nobody sees it (stderr is not a terminal).
    progress = Progress(TextColumn("[bold]{task.fields[status]}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("samples"), TimeElapsedColumn(), console=console, transient=True,
                        refresh_per_second=2, disable=not console.is_terminal)
    task = progress.add_task("rollout", total=samples_per_step, status="setting up")

    def on_status(text: str) -> None:
        """Steps are numbered as in the tables and metrics.jsonl (the rollout_id); set-up is printed."""
        if text.startswith("step ") and text[5:].isdigit():
            step = int(text[5:])
            progress.reset(task, total=samples_per_step, status=f"{text} ({step + 1} of {args.num_rollout})")
        else:
            progress.update(task, status=text)
            console.print(f"[dim]{text}[/dim]", highlight=False)

    def on_step(rollout_id: int, metrics: dict[str, Any]) -> None:
        console.print(step_table(rollout_id, metrics))

    def on_eval(rollout_id: int, metrics: dict[str, Any]) -> None:
        console.print(metrics_table(f"eval after step {rollout_id}", metrics))

    try:
        with progress:
            output = run_job(args, on_step=on_step, on_eval=on_eval, on_status=on_status,
                             progress=lambda n: progress.advance(task, n))
    except (RlsdkError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]Error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print(f"interrupted; continue with: rlsdk run --resume --output {args.output_dir}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130) from None
    console.print(f"wrote {output.folder}/rollouts.jsonl, metrics.jsonl and state.json", highlight=False)


@with_run_options
def evaluate(**options: Any) -> None:
    """Evaluate the model on the eval datasets (or the training data) once."""
    extra = options.pop("extra")
    args = build_config(options.pop("config"), options, extra)
    if not args.eval_datasets and not args.eval_prompt_data:
        args.eval_datasets = [{"name": Path(args.prompt_data).stem, "path": args.prompt_data}]
    from rlsdk.job import RunOutput, run_eval, running

    try:
        with running(args) as (runtime, plugins):
            result = run_eval(args, runtime, plugins, rollout_id=0)
    except (RlsdkError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]Error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    Console().print(metrics_table("eval", result.metrics))
    if options["output_dir"] is not None:  # appended, so an eval beside a run's own evals keeps both
        output = RunOutput(args.output_dir)
        output.write_eval(0, result)
        console.print(f"wrote {output.folder}/eval.jsonl and eval_samples.jsonl", highlight=False)
    typer.echo(json.dumps(result.metrics))


def step_table(rollout_id: int, metrics: dict[str, Any]) -> Group:
    """The step's rollout row (and a line with the drop reasons and aborts, which a column would cut at 80
    columns), and with ``--train`` its train row; a rollout function that reports no ledger (a slime-style
    bare list) shows ``-``."""
    parts = [f"{k.removeprefix('rollout/dynamic_filter/drop_')} {v}" for k, v in metrics.items()
             if k.startswith("rollout/dynamic_filter/drop_")]
    notes = "; ".join(filter(None, [f"dropped: {', '.join(parts)}" if parts else "",
                                    f"aborted {metrics['rollout/aborted']}" if metrics.get("rollout/aborted") else ""]))
    rollout: list[Any] = [row_table(f"step {rollout_id}", metrics, ROLLOUT_COLUMNS)]
    if notes:
        rollout.append(Text(notes, overflow="fold"))
    if not any(key in metrics for _, key, _ in TRAIN_COLUMNS):
        return Group(*rollout)
    return Group(*rollout, row_table(f"step {rollout_id}: train", metrics, TRAIN_COLUMNS))


ROLLOUT_COLUMNS = (("reward", "rollout/reward_mean", "{:.3f}"),
                   ("all", "rollout/reward_mean_before_filter", "{:.3f}"),
                   ("sd", "rollout/reward_group_std_mean", "{:.3f}"), ("kept", "ledger/kept", "{}"),
                   ("dropped", "ledger/dropped", "{}"), ("returned", "ledger/returned", "{}"),
                   ("failed", "ledger/failed", "{}"), ("tok/s", "rollout/tokens_per_s", "{:.0f}"),
                   ("s", "rollout/seconds", "{:.1f}"))
"""``reward``: the kept samples' mean; ``all``: every scored sample's, before the filters; ``sd``: the
mean over those groups of their rewards' standard deviation (0 in a group gives GRPO nothing to learn)."""
TRAIN_COLUMNS = (("loss", "train/loss", "{:.4f}"), ("KL", "train/kl_loss", "{:.4f}"),
                 ("entropy", "train/entropy_loss", "{:.3f}"), ("clip", "train/pg_clipfrac", "{:.3f}"),
                 ("grad norm", "train/grad_norm", "{:.3f}"), ("train s", "train/seconds", "{:.1f}"),
                 ("sync s", "train/sync_seconds", "{:.2f}"))


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
