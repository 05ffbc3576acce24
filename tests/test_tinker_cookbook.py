"""tinker-cookbook 0.6.1's own recipes, unchanged, train on ``rlsdk tinker serve`` (SmolLM2-135M-Instruct on the
CPU): ``sl_loop``, then ``rl_loop`` resuming from its state, each run with its own command line in the
cookbook's environment (scripts/tinker_cookbook_env.sh; the test skips without it) with only
``TINKER_BASE_URL`` and ``TINKER_API_KEY`` set, and offline:

- the recipes' default model name (``Qwen/Qwen3.5-9B-Base``, which picks their ``role_colon`` renderer) is
  served as SmolLM2, and a folder of that name in the working directory links to SmolLM2, so the recipes'
  tokenizer loads from it (transformers reads a local folder before the hub);
- their datasets (``HuggingFaceH4/no_robots``, ``openai/gsm8k``) are folders of that name in the working
  directory (``datasets`` too reads a local folder first), holding single-digit additions; the supervised
  run teaches the boxed answer format, so the RL run's rewards differ within a group and it trains.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")

pytestmark = pytest.mark.plugins("rlsdk_embedded")

ROOT = Path(__file__).resolve().parent.parent
COOKBOOK_PYTHON = Path(os.environ.get("RLSDK_TINKER_COOKBOOK_PYTHON", ROOT / ".venv-cookbook" / "bin" / "python"))
NAME = "Qwen/Qwen3.5-9B-Base"
KEY = "tml-cookbook-test-0123456789"
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."

if not COOKBOOK_PYTHON.is_file():
    pytest.skip(
        f"no tinker-cookbook environment at {COOKBOOK_PYTHON}: bash scripts/tinker_cookbook_env.sh",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rlsdk_embedded.model_files import ModelNotFoundError, default_model_path

    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    from rlsdk_embedded.engine import EmbeddedEngine

    from rlsdk.tinker.server import ServerThread
    from rlsdk.tinker.service import TinkerService
    from rlsdk.tinker.training import Placement

    service = TinkerService(
        {NAME: smollm2},
        lambda folder: EmbeddedEngine(str(folder), device="cpu"),
        tmp_path_factory.mktemp("cookbook-checkpoints"),
        Placement("cpu", "float32"),
        sampling_seed=0,  # the recipes seed nothing: the RL run samples the same tokens every time
    )
    with ServerThread(service, [KEY]) as url:
        yield url


@pytest.fixture(scope="module")
def workdir(smollm2, tmp_path_factory) -> Path:
    """The recipes' working directory: their model name and dataset names as local folders."""
    work = tmp_path_factory.mktemp("cookbook")
    (work / NAME).parent.mkdir(parents=True)
    (work / NAME).symlink_to(smollm2)
    rng = random.Random(0)
    sums = [(rng.randint(1, 4), rng.randint(1, 4)) for _ in range(40)]
    chats = work / "HuggingFaceH4" / "no_robots" / "train.jsonl"
    chats.parent.mkdir(parents=True)
    chats.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {a} + {b}?{SUFFIX}"},
                        {"role": "assistant", "content": f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}"},
                    ]
                }
            )
            + "\n"
            for a, b in sums[:16]
        )
    )
    gsm8k = work / "openai" / "gsm8k"
    (gsm8k / "main").mkdir(parents=True)
    (gsm8k / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n---\n"
    )
    (gsm8k / "main" / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}) + "\n"
            for a, b in sums[16:]
        )
    )
    return work


def recipe(name: str, url: str, workdir: Path, *config: str) -> subprocess.CompletedProcess[str]:
    """``python -m tinker_cookbook.recipes.NAME CONFIG...`` in the cookbook's environment."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "TINKER_BASE_URL": url,
        "TINKER_API_KEY": KEY,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(workdir / ".hf"),
    }
    command = [str(COOKBOOK_PYTHON), "-m", f"tinker_cookbook.recipes.{name}", *config]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(600)  # two recipes in subprocesses: about 170 s on 2 idle cores, 300 under load
def test_the_supervised_and_rl_loops_train_unchanged(server, workdir):
    log_path = workdir / "run"
    recipe("sl_loop", server, workdir, f"log_path={log_path}", "batch_size=4", "learning_rate=1e-3", "save_every=0")
    supervised = metrics(log_path)
    assert len(supervised) == 4  # 16 conversations, 4 a batch
    nll = [row["train_mean_nll"] for row in supervised]
    assert nll[-1] < nll[0] / 2, nll
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    rest = tinker.RestClient(base_url=server, api_key=KEY)
    run_id = final["state_path"].split("/")[2]
    listed = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
    assert {final["state_path"], final["sampler_path"]} <= listed

    # the RL loop finds the supervised run's checkpoint in the same log_path and resumes from it (weights and
    # optimizer state), at the batch it stopped at
    rl = recipe(
        "rl_loop",
        server,
        workdir,
        f"log_path={log_path}",
        "batch_size=2",
        "group_size=4",
        "max_tokens=16",
        "max_steps=6",
        "save_every=0",
        "loss_fn=importance_sampling",
    )
    assert "Resuming from batch 4" in rl.stdout + rl.stderr
    steps = metrics(log_path)[len(supervised) :]
    assert [row["step"] for row in steps] == [4, 5]
    assert all(0.0 <= row["reward/total"] <= 1.0 for row in steps)
    trained = [row for row in steps if "grad_norm:mean" in row]  # a batch whose rewards all tie is skipped
    assert trained and all(row["grad_norm:mean"] > 0 for row in trained), steps
