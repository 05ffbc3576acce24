"""The hook implementations that register rm_hub's rewards (implementations load lazily: heavy modules
such as math-verify and httpx are imported only inside the calls that need them)."""

from rlsdk import Option, Reward, hookimpl

from . import f1, math_grader, remote, slime_rewards


@hookimpl
def rlsdk_rewards():
    yield Reward(
        name="math",
        func=math_grader.math,
        description="Final answer (boxed or not) equal to the label: exact, then math-verify; cached",
    )
    yield Reward(
        name="slime_math",
        func=slime_rewards.slime_math,
        description="slime's math: last \\boxed{} vs label by MATH normalization or sympy",
    )
    yield Reward(
        name="deepscaler",
        func=slime_rewards.deepscaler,
        description="DeepScaleR: last \\boxed{} after </think>, MATH normalization or sympy; 1/0",
    )
    # cheap=True: linear-time string work, called on the event loop without a thread hop
    yield Reward(
        name="dapo",
        func=slime_rewards.dapo,
        cheap=True,
        description="DAPO: Minerva 'Answer:' in the last 300 chars; {score: ±1, acc, pred}",
    )
    yield Reward(name="f1", func=f1.f1, cheap=True, description="SQuAD token F1 between response and label")
    yield Reward(
        name="gpqa",
        func=slime_rewards.gpqa,
        cheap=True,
        description="GPQA: chosen letter vs metadata.correct_letter; 1/0",
    )
    yield Reward(name="random", func=slime_rewards.random, cheap=True, description="0 or 1 at random")
    for name in ("remote", "remote_rm"):
        yield Reward(
            name=name,
            func=remote.remote,
            description="POST {prompt, response, label} to --rm-url; a number or a dict back",
        )


@hookimpl
def rlsdk_options():
    yield Option(
        "rm_url", str, help="URL of the remote reward model for the remote reward (slime's --rm-url)."
    )
    yield Option(
        "grader_timeout",
        float,
        10.0,
        help="Seconds one grading may run in a worker process (math, "
        "slime_math, deepscaler) before the worker is killed and the sample marked invalid.",
    )
    yield Option(
        "grader_workers", int, help="Worker processes for CPU-heavy grading; default min(4, cpu_count)."
    )
    yield Option("rm_request_timeout", float, 30.0, help="Seconds per HTTP request of the remote reward.")
    yield Option(
        "rm_retries",
        int,
        3,
        help="Retries of the remote reward on connection errors, timeouts and 5xx (never on 4xx).",
    )
    yield Option(
        "rm_backoff",
        float,
        0.5,
        help="Base seconds of the remote reward's exponential backoff (full jitter) between retries.",
    )
    yield Option(
        "rm_max_connections", int, 64, help="Connections the remote reward keeps open to its server at most."
    )
    yield Option(
        "dapo_strict_box", bool, False, help="The dapo reward reads the last \\boxed{} instead of 'Answer:'."
    )
