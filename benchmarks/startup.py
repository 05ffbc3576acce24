"""CPU time of the CLI's start-up in fresh processes: ``rlsdk plugins list``, ``rlsdk --help`` and
``import rlsdk``, and proof of what each did (the plugins it listed, the modules it imported).

Baselines, measured in the same run: a bare interpreter (``python -c pass``); a fresh interpreter importing
what any typer CLI imports (typer and rich); and ``plugins list`` in a process that first imports every
subcommand's module, as the CLI did before its subcommands loaded lazily (``eager_plugins_list``). Each figure is the median of
``--repeat`` runs' user + system CPU seconds (``os.wait4``), after one untimed run that writes the bytecode
caches (a user's install has them; ``PYTHONDONTWRITEBYTECODE`` is dropped for the children).
Targets (issue 56): ``plugins list`` under 0.4 s of CPU, ``import rlsdk`` under 0.15 s; neither imports
torch, transformers, sglang, math-verify or aiohttp.

    python benchmarks/startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

HEAVY = ("torch", "transformers", "sglang", "math_verify", "aiohttp")
SUBCOMMAND_MODULES = ("plugins", "run", "score", "serve", "export", "view", "buffer", "tinker")
PROBE = (
    "import sys, runpy; sys.argv = ['rlsdk', *{argv!r}];\n"
    "try:\n    runpy.run_module('rlsdk_cli.app', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "print('HEAVY=' + ','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)"
)
TARGETS = {"plugins_list_cpu_s": 0.4, "import_rlsdk_cpu_s": 0.15}


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def cpu_seconds(cmd: list[str]) -> tuple[float, str]:
    """User + system CPU seconds of one run of ``cmd`` (its own, from ``wait4``) and its stdout."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env()) as proc:
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, out.decode()


def timed(cmd: list[str], repeat: int) -> tuple[float, str]:
    """Median CPU seconds of ``cmd`` over ``repeat`` fresh processes (after an untimed warm-up) and its
    stdout."""
    _, out = cpu_seconds(cmd)
    return statistics.median(cpu_seconds(cmd)[0] for _ in range(repeat)), out


def heavy_imports(argv: list[str]) -> list[str]:
    code = PROBE.format(argv=argv, heavy=HEAVY)
    err = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env()
    ).stderr
    line = [x for x in err.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    opts = parser.parse_args()
    python = [sys.executable]
    rlsdk = [*python, "-m", "rlsdk_cli.app"]
    eager = (
        "import sys; import " + ", ".join(f"rlsdk_cli.{m}" for m in SUBCOMMAND_MODULES) + "; "
        "sys.argv = ['rlsdk', 'plugins', 'list', '--json']; from rlsdk_cli.app import main; main()"
    )
    probe_import = f"import sys, rlsdk; print(rlsdk.__version__, [m for m in {HEAVY!r} if m in sys.modules])"
    interpreter, _ = timed([*python, "-c", "pass"], opts.repeat)
    typer_rich, _ = timed([*python, "-c", "import typer, rich.table, rich.console"], opts.repeat)
    eager_s, eager_listed = timed([*python, "-c", eager], opts.repeat)
    listed_s, listed = timed([*rlsdk, "plugins", "list", "--json"], opts.repeat)
    help_s, help_text = timed([*rlsdk, "--help"], opts.repeat)
    import_s, imported = timed([*python, "-c", probe_import], opts.repeat)
    rows = json.loads(listed)
    results = {"plugins_list_cpu_s": listed_s, "help_cpu_s": help_s, "import_rlsdk_cpu_s": import_s}
    report = {
        "benchmark": "startup",
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "repeat": opts.repeat,
        "baseline_interpreter_cpu_s": interpreter,
        "baseline_typer_rich_cpu_s": typer_rich,
        "baseline_eager_plugins_list_cpu_s": eager_s,
        **results,
        "evidence": {
            "plugins_listed": len(rows),
            "core_listed": any(r["distribution"] == "rlsdk" for r in rows),
            "eager_listed_the_same": json.loads(eager_listed) == rows,
            "help_lists_run": " run " in help_text,
            "import_rlsdk_printed": imported.strip(),
        },
        "heavy_imports": {
            "plugins list": heavy_imports(["plugins", "list"]),
            "--help": heavy_imports(["--help"]),
        },
        "targets_cpu_s": TARGETS,
        "meets_targets": all(results[k] < v for k, v in TARGETS.items()),
        "lazy_saves_cpu_s": eager_s - listed_s,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
