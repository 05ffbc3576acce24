"""What a run's settings are and where each comes from: the start-up summary of ``rlsdk run`` and its
``--print-config`` (the whole configuration as YAML, usable as ``--config``), as slime prints its arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlsdk import RolloutConfig
from rlsdk.config import demo_settings, uses_core_data_source
from rlsdk.errors import RlsdkError
from rlsdk.options import EVAL_SET_SETTINGS

GIVEN, ENV, DEMO, RESUMED, DEFAULT = "given", "env", "demo", "resumed", "default"
SOURCES_LINE = (
    "settings (given; env: set by --env; demo: set by the demo because no --data is given; "
    "resumed: the saved run's; default):"
)
NOT_SETTINGS = ("resume", "overwrite", "sglang_router_ip", "sglang_router_port", "extra")
"""Fields that are the command's state, not a setting a config file would hold."""
SUMMARY = (
    "env",
    "prompt_data",
    "input_key",
    "label_key",
    "apply_chat_template",
    "engine",
    "model",
    "rm_type",
    "custom_rm_path",
    "data_source_path",
    "custom_generate_function_path",
    "agent_function_path",
    "rollout_sample_hook_path",
    "num_rollout",
    "rollout_batch_size",
    "n_samples_per_prompt",
    "rollout_max_response_len",
    "eval_datasets",
    "eval_prompt_data",
    "eval_interval",
    "output_dir",
)
TRAIN_SUMMARY = (
    "lr",
    "eps_clip",
    "eps_clip_high",
    "global_batch_size",
    "use_rollout_logprobs",
    "save_interval",
)
"""The settings the start-up summary shows (with ``--train`` also :data:`TRAIN_SUMMARY`), beside every option
given."""


def setting_sources(
    args: RolloutConfig, given: set[str], *, pm: Any = None, resumed: bool = False
) -> dict[str, str]:
    """Each option's source: ``given`` (command line, ``--set``, config file), ``env`` (set by the environment
    ``--env`` names, by the plugins of ``pm``), ``demo`` (set by the shipped demo because no ``--data``, ``--env``
    or data source was given; see :func:`rlsdk.config.demo_settings`), ``resumed`` (with ``resumed``: the saved
    run's value, where it is not the default) or ``default``."""
    ran_demo = not {"prompt_data", "env"} & given and uses_core_data_source(args)
    demo = demo_settings(args.train) if ran_demo else {}
    env = environment_settings(args, pm) if not demo else {}
    defaults = settings(RolloutConfig.from_dict({}, pm=pm)) if resumed else {}
    values = settings(args)
    sources = {}
    for name in [*RolloutConfig.option_names(), *args.extra]:
        if name in given:
            sources[name] = GIVEN
        elif name in env and values.get(name) == env[name]:
            sources[name] = ENV
        elif name in demo and values.get(name) == demo[name]:
            sources[name] = DEMO
        elif resumed and values.get(name) != defaults.get(name):
            sources[name] = RESUMED
        else:
            sources[name] = DEFAULT
    return sources


def environment_settings(args: RolloutConfig, pm: Any) -> dict[str, Any]:
    """The options the run's environment sets (none without ``--env``), as :class:`RolloutConfig` checks them."""
    from rlsdk.config import core_options, environment_options

    name = args.choices.get("env")
    if not name:
        return {}
    options = environment_options(name, pm, train=args.train)
    core = core_options()
    return {k: core[k].check(v) if k in core else v for k, v in options.items()}


def settings(args: RolloutConfig) -> dict[str, Any]:
    """Every option's value (plugins' options included), as a config file holds them."""
    values = {k: v for k, v in args.to_dict().items() if k not in NOT_SETTINGS}
    return {**values, **args.extra}


def config_yaml(args: RolloutConfig, sources: dict[str, str]) -> str:
    """The whole configuration as YAML, each option not at its default commented with its source."""
    lines = []
    for name, value in settings(args).items():
        option = yaml.safe_dump({name: value}, default_flow_style=False, width=10**6).splitlines()
        source = sources.get(name, GIVEN)
        if source != DEFAULT:
            option[0] += f"  # {source}"
        lines += option
    return "\n".join(lines) + "\n"


def summary_lines(args: RolloutConfig, sources: dict[str, str]) -> list[str]:
    """The start-up summary: the main settings and every given one, each with its source, and with
    ``--data`` and ``--train`` the demo's training settings that do not apply."""
    names = [*SUMMARY, *(TRAIN_SUMMARY if args.train else ())]
    names += [
        n for n, source in sources.items() if source == GIVEN and n not in names and n not in NOT_SETTINGS
    ]
    values = settings(args)
    lines = [SOURCES_LINE]
    for name in names:
        value = values.get(name)
        if (value is None and name != "label_key") or (value == [] and sources.get(name) == DEFAULT):
            continue
        lines.append(f"  {name} = {short(value)}  ({sources.get(name, GIVEN)})")
    if sources.get("prompt_data") == GIVEN and not args.choices.get("env"):
        skipped = [
            f"{name} {short(values.get(name))} (demo {short(demo)})"
            for name, demo in demo_settings(args.train).items()
            if sources.get(name) == DEFAULT
            and values.get(name) != demo
            and name not in ("env", "prompt_data")
        ]
        if skipped:
            lines.append("  with --data the demo's settings do not apply: " + "; ".join(skipped))
    lines.append("  (every setting: the same command with --print-config)")
    return lines


def short(value: Any) -> str:
    """A value on one line: an eval dataset list as ``name=path`` pairs."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return ", ".join(f"{v['name']}={v.get('path')}" for v in value)
    return str(value)


FROM_CHECKPOINT = (
    "prompt_data",
    "input_key",
    "label_key",
    "metadata_key",
    "tool_key",
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "rollout_max_prompt_len",
    "rm_type",
    "custom_rm_path",
    "group_rm",
    "reward_key",
    "eval_reward_key",
    "eval_function_path",
    "custom_generate_function_path",
    "agent_function_path",
    "rollout_max_response_len",
    "rollout_temperature",
    "rollout_top_p",
    "rollout_top_k",
    "rollout_stop",
    "rollout_stop_token_ids",
    *EVAL_SET_SETTINGS,
)
"""What ``rlsdk eval --model CHECKPOINT`` takes from the checkpoint's run unless given: its data's keys and
template, its reward, its generators and its eval sets with their sampling."""


def with_checkpoint_settings(args: RolloutConfig, given: set[str]) -> tuple[RolloutConfig, list[str]]:
    """Where ``args.model`` is a checkpoint of an ``rlsdk run --train``: ``args`` with :data:`FROM_CHECKPOINT`
    and the plugins' options from its run's settings, except those ``given``, and the names taken."""
    from pathlib import Path

    from rlsdk.training.session import checkpoint_settings

    saved = checkpoint_settings(Path(args.model)) if args.model else None
    if saved is None:
        return args, []
    names = [n for n in FROM_CHECKPOINT if n in saved and n not in given]
    plugin_options = {k: v for k, v in (saved.get("extra") or {}).items() if k not in given}
    args = args.replace(**{name: saved[name] for name in names}, **plugin_options)
    return args, names + list(plugin_options)


def checkpoint_refusals(args: RolloutConfig, taken: list[str]) -> dict[str, str]:
    """The texts of the settings ``taken`` from a checkpoint this machine did not write, mapped to why code
    they name is not loaded (:func:`rlsdk.plugins.loading.refusing_code`); nothing for one it wrote."""
    from pathlib import Path

    from rlsdk.state_files import strings_in
    from rlsdk.training.session import CHECKPOINT_META, checkpoint_signed_here

    if not taken or not args.model or checkpoint_signed_here(Path(args.model)):
        return {}
    meta = Path(args.model) / CHECKPOINT_META
    refusals: dict[str, str] = {}
    for name in taken:
        value = getattr(args, name, None) if hasattr(args, name) else args.extra.get(name)
        for text in strings_in(value):
            refusals.setdefault(
                text,
                f"the setting {name} in {meta} names it, and the checkpoint was not written by rlsdk on this "
                f"machine (another machine's, or edited since): a checkpoint is not trusted to name code; "
                f"name it on the command line (--{name.replace('_', '-')} or --set {name}=...)",
            )
    return refusals


def lora_checkpoint(args: RolloutConfig) -> tuple[RolloutConfig, Path | None]:
    """Where ``args.model`` is a LoRA checkpoint of an ``rlsdk run --train --lora-rank`` (an adapter, no
    ``config.json``): ``args`` on the base model its run trained (checked unchanged since), and the adapter's
    folder for the engine to load; else ``args`` and None."""
    from rlsdk.engines.lora_adapter import ADAPTER_CONFIG
    from rlsdk.run.folder import model_fingerprint
    from rlsdk.state_files import read_json
    from rlsdk.training.session import CHECKPOINT_META, checkpoint_settings
    from rlsdk.training_options import named_model_folder

    folder = Path(args.model) if args.model else None
    if folder is None or not (folder / ADAPTER_CONFIG).is_file() or (folder / "config.json").is_file():
        return args, None
    saved = checkpoint_settings(folder)
    if saved is None:
        raise RlsdkError(
            f"{folder} holds a LoRA adapter but no {CHECKPOINT_META} naming its base model: merge it into "
            f"its base first (rlsdk export {folder} --merge --base BASE_MODEL -o MERGED) and evaluate MERGED"
        )
    base = args.replace(
        model=saved.get("model"), hf_checkpoint=args.hf_checkpoint or saved.get("hf_checkpoint")
    )
    trained_on = read_json(folder / CHECKPOINT_META).get("base_model")
    now = model_fingerprint(named_model_folder(base))
    if isinstance(trained_on, dict) and now is not None and trained_on.get("files") != now["files"]:
        raise RlsdkError(
            f"the base model {now['path']} changed since the LoRA adapter {folder} was trained on it: its "
            "scores would be another model's; restore the base model"
        )
    return base, folder
