"""Peak memory of a command and every process it starts: the test suite's, for the README.

Runs the command (default: the README's test command, ``.venv/bin/python -m pytest -q -n 2 --dist loadfile``)
and samples, every ``--interval`` seconds, the proportional set size (PSS: shared pages split between the
processes sharing them, so a library mapped by both xdist workers counts once) summed over the command's
process tree, from ``/proc/PID/smaps_rollup``. The baseline is the machine's used memory before the
command starts; ``system_used_peak_gb`` (``MemAvailable`` gone, minus that baseline) shows what else the
command cost, page tables and the kernel's own included. Prints one JSON object (its last line).

    python benchmarks/suite_memory.py [--interval 1] [-- COMMAND ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from harness import machine

README_TESTS = [".venv/bin/python", "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"]


def children(pid: int) -> list[int]:
    """``pid`` and all its descendants, from each process's parent in /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def used_bytes() -> int:
    fields = {
        line.split(":")[0]: int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
    }
    return fields["MemTotal"] - fields["MemAvailable"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0)
    opts, command = parser.parse_known_args()
    command = [arg for arg in command if arg != "--"] or README_TESTS
    baseline = used_bytes()
    started = time.monotonic()
    process = subprocess.Popen(command)
    peak_pss = peak_used = 0
    peak_processes = 0
    while process.poll() is None:
        tree = children(process.pid)
        peak_pss = max(peak_pss, sum(pss_bytes(pid) for pid in tree))
        peak_used = max(peak_used, used_bytes() - baseline)
        peak_processes = max(peak_processes, len(tree))
        time.sleep(opts.interval)
    report = {
        "benchmark": "suite_memory",
        "command": " ".join(command),
        "exit_code": process.returncode,
        "minutes": round((time.monotonic() - started) / 60, 2),
        "pss_peak_gb": round(peak_pss / 1e9, 2),
        "system_used_peak_gb": round(peak_used / 1e9, 2),
        "baseline_used_gb": round(baseline / 1e9, 2),
        "processes_peak": peak_processes,
        "machine": machine(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
