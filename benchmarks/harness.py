"""What the rollout-loop benchmarks share: a synthetic dataset, the machine, one core.

Imported by ``loop_overhead.py`` and ``long_tail.py`` (run as scripts, so this folder is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def write_prompts(path: Path, count: int) -> Path:
    """``count`` short arithmetic prompts with labels, one JSON row a line."""
    rows = ({"input": f"Question {i}: what is {i} + {i % 7}?", "label": str(i + i % 7)} for i in range(count))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def pin_one_core() -> int | None:
    """Pin this process (and the threads it starts later) to its first allowed core; returns the core."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def machine(core: int | None = None) -> dict[str, Any]:
    """The machine a figure was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "pinned_core": core,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }
