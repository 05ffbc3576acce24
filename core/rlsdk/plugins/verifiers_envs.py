"""verifiers environments as rlsdk environments: ``rlsdk run --env MODULE`` for a module (installed with pip)
that exports verifiers' ``load_environment``.

The environment's datasets become JSONL files (``prompt`` chat messages, ``answer``, and the module,
``example_id``, ``info`` and ``task`` in ``metadata``); its rollouts run as an agent of the ``openai_agent``
generator (:func:`rlsdk.agents.verifiers_agent.verifiers_agent`), through rlsdk's OpenAI-compatible endpoint (so
multi-turn environments record token-exact samples); its rubric's score is the reward
(:func:`~rlsdk.agents.verifiers_agent.verifiers_reward`), each reward function's value logged as a rubric part.
verifiers (``pip install 'rlsdk[verifiers]'``, the 0.3 series with its classic API) is imported only here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

from ..errors import PluginError
from .kinds import Environment
from .loading import check_trusted

MODULE_KEY = "verifiers_env"
"""Row metadata key naming the verifiers environment module the row comes from."""
AGENT = "rlsdk.agents.verifiers_agent:verifiers_agent"
REWARD = "rlsdk.agents.verifiers_agent:verifiers_reward"


def is_verifiers_module(name: str) -> bool:
    """Whether ``name`` is an importable module exporting ``load_environment`` (not imported otherwise)."""
    module = name.replace("-", "_")
    check_trusted(module)  # never a module a file not trusted to name code names
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    return callable(getattr(importlib.import_module(module), "load_environment", None))


def verifiers_environment(name: str) -> Environment:
    """The rlsdk environment of the verifiers environment module ``name``."""
    module = name.replace("-", "_")
    return Environment(
        name=module.replace(".", "_"),
        func=functools.partial(verifiers_settings, module),
        description=f"the verifiers environment {module}",
    )


@functools.cache
def load_verifiers_environment(module: str) -> Any:
    """``verifiers.load_environment(module)``, once per process."""
    try:
        import verifiers
    except ImportError as exc:
        raise PluginError(
            f"{module!r} is a verifiers environment: install verifiers (pip install 'rlsdk[verifiers]')"
        ) from exc
    if not hasattr(verifiers, "load_environment"):
        raise PluginError(
            f"verifiers {verifiers.__version__} has no load_environment (the classic API): rlsdk runs "
            "verifiers environments with verifiers>=0.3,<0.4"
        )
    return verifiers.load_environment(module)


def verifiers_settings(module: str) -> dict[str, Any]:
    """The run options of the verifiers environment ``module``: its datasets as JSONL files, the ``verifiers``
    agent and reward, the chat template."""
    env = load_verifiers_environment(module)
    folder = Path(tempfile.gettempdir()) / "rlsdk-verifiers" / module
    settings: dict[str, Any] = {
        "prompt_data": write_rows(folder, "train", env.get_dataset(), module),
        "input_key": "prompt",
        "label_key": "answer",
        "metadata_key": "metadata",
        "apply_chat_template": True,
        "custom_generate_function_path": "openai_agent",
        "agent_function_path": AGENT,
        "custom_rm_path": REWARD,
    }
    eval_dataset = getattr(env, "eval_dataset", None)
    if eval_dataset is not None:
        path = write_rows(folder, "eval", env.get_eval_dataset(), module)
        settings["eval_datasets"] = [{"name": f"{module}-eval", "path": path}]
    return settings


def write_rows(folder: Path, split: str, dataset: Any, module: str) -> str:
    """A verifiers dataset as rlsdk rows in ``folder``, named by its content (written once)."""
    lines = []
    for row in dataset:
        metadata = {key: row[key] for key in ("example_id", "info", "task") if row.get(key) is not None}
        metadata[MODULE_KEY] = module
        lines.append(
            json.dumps({"prompt": row["prompt"], "answer": row.get("answer", ""), "metadata": metadata})
        )
    text = "\n".join(lines) + "\n"
    path = folder / f"{split}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        staging.write_text(text)
        staging.replace(path)
    return str(path)
