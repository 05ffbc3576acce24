"""Start-up time of `rlsdk plugins list` and `rlsdk --help` in fresh processes, and proof that
neither imports torch, transformers or sglang.

Baseline, measured in the same run: a fresh interpreter importing what any typer CLI imports
(typer and rich). ``ratio`` is baseline time over rlsdk's time (1.0: rlsdk adds nothing to start-up).
Target: under 0.5 s each.

    python benchmarks/startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "sglang", "math_verify")
PROBE = (
    "import sys, runpy; sys.argv = ['rlsdk', *{argv!r}];\n"
    "try:\n    runpy.run_module('rlsdk_cli.app', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "print('HEAVY=' + ','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)"
)


def timed(cmd: list[str], repeat: int) -> float:
    """Median wall time of ``cmd`` in fresh processes."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def heavy_imports(argv: list[str]) -> list[str]:
    code = PROBE.format(argv=argv, heavy=HEAVY)
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    line = [x for x in err.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    opts = parser.parse_args()
    rlsdk = [sys.executable, "-m", "rlsdk_cli.app"]
    baseline = timed([sys.executable, "-c", "import typer, rich.table, rich.console"], opts.repeat)
    results = {
        "plugins_list_s": timed([*rlsdk, "plugins", "list"], opts.repeat),
        "help_s": timed([*rlsdk, "--help"], opts.repeat),
    }
    worst = max(results.values())
    report = {
        "benchmark": "startup",
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "repeat": opts.repeat,
        "baseline_typer_rich_import_s": baseline,
        **results,
        "heavy_imports": {"plugins list": heavy_imports(["plugins", "list"]), "--help": heavy_imports(["--help"])},
        "target_s": 0.5,
        "meets_target": worst < 0.5,
        "ratio": baseline / worst,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
