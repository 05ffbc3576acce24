"""``rlsdk export``: a checkpoint's model as a folder others load, the LoRA adapter merged in on request."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def export(
    checkpoint: Path = typer.Argument(..., help="A checkpoint folder (<output>/checkpoints/step_N)."),
    output: Path = typer.Option(..., "--output", "-o", help="Folder to write (must not exist)."),
    merge: bool = typer.Option(
        False, "--merge", help="Merge the checkpoint's LoRA adapter into --base: a plain Hugging Face model."
    ),
    base: Path | None = typer.Option(
        None, "--base", help="With --merge: the model folder the adapter was trained on."
    ),
) -> None:
    """Write a checkpoint's model (a Hugging Face folder), or its LoRA adapter (a PEFT folder), without the
    optimizer, random states and critic; ``--merge`` writes the adapter merged into ``--base`` instead. The
    base model is never read from what the checkpoint names: pass it."""
    if output.exists():
        raise typer.BadParameter(f"{output} exists: choose a new folder", param_hint="--output")
    is_adapter = (checkpoint / ADAPTER_FILES[0]).is_file()
    if not is_adapter and not (checkpoint / MODEL_FILES[0]).is_file():
        raise typer.BadParameter(
            f"{checkpoint} holds neither a model nor a LoRA adapter", param_hint="CHECKPOINT"
        )
    if merge:
        if not is_adapter:
            raise typer.BadParameter(
                f"{checkpoint} holds a whole model, no LoRA adapter to merge", param_hint="--merge"
            )
        if base is None:
            raise typer.BadParameter("--merge needs --base, the model folder the adapter was trained on")
        from rlsdk.training.lora import merge_adapter  # torch, transformers and peft load only here

        try:
            merge_adapter(checkpoint, base, output)
        except (OSError, ValueError) as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None
        keep_run_settings(checkpoint, output)
        typer.echo(f"wrote {output}: {base.name} with the adapter of {checkpoint} merged in")
        return
    output.mkdir(parents=True)
    kept = [
        name
        for name in (*(ADAPTER_FILES if is_adapter else MODEL_FILES), *TOKENIZER_FILES)
        if (checkpoint / name).is_file()
    ]
    for name in kept:
        shutil.copy2(checkpoint / name, output / name)
    keep_run_settings(checkpoint, output)
    typer.echo(
        f"wrote {output}: the {'LoRA adapter' if is_adapter else 'model'} of {checkpoint} ({', '.join(kept)})"
    )


def keep_run_settings(checkpoint: Path, output: Path) -> None:
    """The checkpoint's run settings (``rlsdk_checkpoint.json``) beside the exported model, so that ``rlsdk
    eval --model OUTPUT`` scores it as the run evaluated it: its eval sets, reward and data keys."""
    from rlsdk.training.session import CHECKPOINT_META

    if (checkpoint / CHECKPOINT_META).is_file():
        shutil.copy2(checkpoint / CHECKPOINT_META, output / CHECKPOINT_META)
