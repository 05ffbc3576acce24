"""The hook implementations that register rm_hub's rewards (implementations load lazily: heavy modules
such as math-verify and httpx are imported only inside the calls that need them)."""

from rlsdk import Reward, hookimpl

from . import f1, math_grader, remote, slime_rewards


@hookimpl
def rlsdk_rewards():
    yield Reward(name="math", func=math_grader.math,
                 description="Final answer (boxed or not) equal to the label: exact, then math-verify; cached")
    yield Reward(name="slime_math", func=slime_rewards.slime_math,
                 description="slime's math: last \\boxed{} vs label by MATH normalization or sympy")
    yield Reward(name="deepscaler", func=slime_rewards.deepscaler,
                 description="DeepScaleR: last \\boxed{} after </think>, MATH normalization or sympy; 1/0")
    # cheap=True: linear-time string work, called on the event loop without a thread hop
    yield Reward(name="dapo", func=slime_rewards.dapo, cheap=True,
                 description="DAPO: Minerva 'Answer:' in the last 300 chars; {score: ±1, acc, pred}")
    yield Reward(name="f1", func=f1.f1, cheap=True, description="SQuAD token F1 between response and label")
    yield Reward(name="gpqa", func=slime_rewards.gpqa, cheap=True,
                 description="GPQA: chosen letter vs metadata.correct_letter; 1/0")
    yield Reward(name="random", func=slime_rewards.random, cheap=True, description="0 or 1 at random")
    for name in ("remote", "remote_rm"):
        yield Reward(name=name, func=remote.remote,
                     description="POST {prompt, response, label} to --rm-url; a number or a dict back")
