"""Equivalence cases for each grader, pathological inputs, and calls from threads, loops and processes."""

import asyncio
import concurrent.futures
import multiprocessing

import pytest

from rlsdk import Sample
from rlsdk import REWARD_ERROR
from rlsdk.testing import check_reward
from rlsdk.testing import score as score_samples, scored
from rlsdk_rm_hub.final_answer import answer_candidates
from rlsdk_rm_hub.math_grader import quick_verdict
from rlsdk_rm_hub.normalize import math_normalize, minerva_normalize


MATH_CASES = [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{3}}", "\\frac{3}{4}", 0.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("\\boxed{3\\sqrt{2}}", "2\\sqrt{2}", 0.0),
    ("\\boxed{[1, 2)}", "[1,2)", 1.0),
    ("\\boxed{\\left[1, 2\\right)}", "[1,2)", 1.0),
    ("\\boxed{(1, 2]}", "[1,2)", 0.0),
    ("\\boxed{(1, 2, 3)}", "(1,2,3)", 1.0),
    ("\\boxed{(3, 2, 1)}", "(1,2,3)", 0.0),
    ("\\boxed{50\\%}", "0.5", 1.0),
    ("\\boxed{5\\text{ cm}}", "5", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{1{,}000}", "1000", 1.0),
    ("\\boxed{ x^{2} + 1 }", "1+x^2", 1.0),
    ("first \\boxed{2} then finally \\boxed{3}", "3", 1.0),
    ("\\boxed{2} and \\boxed{3}", "2, 3", 1.0),
    ("no answer here", "3", 0.0),
    ("", "3", 0.0),
    ("6 + 5 = ?", "11", 0.0),
    ("What is 6 + 5?", "11", 0.0),
    ("The answer is 6 + 5.", "11", 0.0),
    ("6 + 5 = 11", "11", 1.0),
    ("So the sum is 11. I hope this helps!", "11", 1.0),
    ("The final answer is $\\frac{1}{2}$.", "0.5", 1.0),
    ("The final answer is $4/54$.", "\\frac{2}{27}", 1.0),
    ("<think>maybe \\boxed{4}</think> The answer is 5.", "5", 1.0),
]


@pytest.mark.parametrize("response,label,expected", MATH_CASES)
def test_math_equivalence(response, label, expected, graded):
    sample = graded(response, label)
    assert sample.reward == expected, sample.metadata


def test_the_in_process_path_decides_plain_numbers_exactly_and_leaves_the_rest():
    assert quick_verdict("0.333333", "\\frac{1}{3}") is False  # exact: a rounding is not the value
    assert quick_verdict("\\frac{6}{8}", "0.75") is True
    assert quick_verdict("1{,}000", "1000") is True
    assert quick_verdict("12", "15") is False
    assert quick_verdict("x+1", "1+x") is None  # symbolic: a worker decides
    assert quick_verdict("2^{10}", "1024") is None  # powers are never evaluated in process


def test_final_answer_only():
    assert answer_candidates("6 + 5 = ?") == []
    assert answer_candidates("6 + 5 = 11.") == ["11"]
    assert answer_candidates("The answer is 11 because 6 plus 5 is 11.") == ["11"]
    assert answer_candidates("So THE ANSWER: 12. Then more words") == ["12"]
    assert answer_candidates("the anſwer is 13. We checked 5 cases.") == [
        "13"
    ]  # what (?i) matches, the casefold pre-check sees
    assert answer_candidates("It costs 2.5 dollars. Is that 3.5?\nok") == [
        "2.5"
    ]  # decimals stay in a sentence


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("\\boxed{2^{10^{10^{10}}}}", "3", 0.0),
        ("\\boxed{2^{10^{10^{10}}}}", "x", 0.0),  # never handed to sympy, which would not return
        ("\\boxed{" + "(" * 400 + "1" + ")" * 400 + "}", "1", 1.0),
        ("\\boxed{" + "7" * 10000 + "}", "7" * 10000, 1.0),
        ("\\boxed{" + "7" * 10000 + "}", "7" * 9999 + "8", 0.0),
        ("{" * 20000 + "\\boxed{1" + "}" * 20000, "3", 0.0),
        ("\\boxed{(10^{10})!}", "(10^{10})!+1", 0.0),
        ("\\boxed{10^{-1000}}", "0", 0.0),
    ],
)
def test_pathological_inputs_are_decided_within_the_timeout(response, label, expected, graded):
    sample = graded(response, label)
    assert sample.reward == expected, sample.metadata


def test_timeout_is_invalid_not_zero(hub_pm, args):
    """A worker that runs out of time makes the sample invalid (here a real 1 ms timer on sympy's work)."""
    sample = scored(
        hub_pm, "\\boxed{x^2+2x+1}", "(x+1)^2", args.replace(rm_type="math", grader_timeout=0.001)
    )
    assert sample.reward is None and sample.status is Sample.Status.FAILED
    assert "timed out" in sample.metadata[REWARD_ERROR]


def test_grader_from_threads(args):
    from rlsdk_rm_hub.math_grader import grade

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda pair: grade(*pair, timeout=5, processes=1),
                [("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"), ("\\boxed{7}", "8")] * 4,
            )
        )
    assert results == [1.0, 0.0] * 4


def test_grader_from_event_loop(args):
    from rlsdk_rm_hub.math_grader import math

    async def run():
        samples = [
            Sample(response="\\boxed{x^2+2x+1}", label="(x+1)^2"),
            Sample(response="\\boxed{x}", label="y"),
        ]
        return await asyncio.gather(*(math(args, s) for s in samples))

    assert asyncio.run(run()) == [1.0, 0.0]


def test_sequential_tasks_reuse_one_worker():
    """A new worker (seconds of imports) starts only when every started one is busy: tasks that never
    overlap are all served by the first."""
    from rlsdk_rm_hub.math_grader import GRADE
    from rlsdk_rm_hub.pool import GraderPool

    pool = GraderPool(processes=3)
    try:
        assert [pool.run(GRADE, pair, timeout=10) for pair in [("1/2", "0.5"), ("x", "y"), ("2", "2")]] == [
            True,
            False,
            True,
        ]
        assert len(pool._slots.idle) == 1  # the idle workers, all started
    finally:
        pool.shutdown()


def test_a_killed_worker_is_replaced_only_when_no_idle_one_is_left():
    """After a worker is killed for not answering, the next task goes to an idle worker, not to a new
    one (seconds of imports). The stuck worker is real: it blocks SIGALRM, so its timer cannot stop a
    sleep and the parent must kill it."""
    import signal

    from rlsdk_rm_hub.pool import GraderPool, WorkerError

    pool = GraderPool(processes=2)
    try:
        both = [pool.submit("time:sleep", (0.5,), 10) for _ in range(2)]  # overlapping: two workers start
        assert [f.result() for f in both] == [None, None]
        pids = {worker.process.pid for worker in pool._slots.idle}
        assert len(pids) == 2
        pool.run("signal:pthread_sigmask", (signal.SIG_BLOCK, [signal.SIGALRM]), 10)
        with pytest.raises(WorkerError, match="worker killed"):
            pool.run("time:sleep", (5,), 0.2)  # the same worker: last in, first out
        survivor = pool.run("os:getpid", (), 10)
        assert survivor in pids
        assert [worker.process.pid for worker in pool._slots.idle] == [survivor]
    finally:
        pool.shutdown()


def _grade_in_child(pair):
    from rlsdk_rm_hub.math_grader import grade

    return grade(*pair, timeout=5, processes=1)


def test_grader_from_several_processes():
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_grade_in_child, [("\\boxed{\\frac{6}{8}}", "0.75"), ("\\boxed{\\pi}", "3")]) == [
            1.0,
            0.0,
        ]


@pytest.mark.parametrize(
    "rm,response,label,expected",
    [
        ("deepscaler", "###Response \\boxed{90^\\circ}", ["90", "45"], 1.0),  # a list of labels: any one
        ("boxed_f1", "I think \\boxed{Paris}", "paris", 1.0),  # boxed_: the boxed answer is graded
        ("boxed_f1", "Paris", "paris", 0.0),
    ],
)
def test_what_rlsdk_adds_to_slimes_graders(rm, response, label, expected, graded):
    """Beyond slime's verdicts (test_slime_parity.py): several labels, and the ``boxed_`` prefix."""
    sample = graded(response, label, rm=rm)
    assert sample.reward == expected, sample.metadata


@pytest.mark.parametrize(
    "response,label,acc",
    [
        ("work...\nAnswer: 1,000", "1000", True),
        ("work...\nAnswer: $42$<|im_end|>", "42.0", True),
        ("work...\nAnswer: 12 dollars", "12", True),
        ("work...\nAnswer: 13", "12", False),
        ("Answer: 12" + " filler" * 100, "12", False),
    ],
)
def test_dapo(response, label, acc, graded):
    reward = graded(response, label, rm="dapo").reward
    assert reward["acc"] is acc and reward["score"] == (1.0 if acc else -1.0) and "pred" in reward


@pytest.mark.parametrize(
    "response,metadata,label,expected",
    [
        ("The answer is B.", {"correct_letter": "B"}, None, 1.0),
        ("I pick C", {}, "C", 1.0),
        ("The answer is B", {"choices": ["red", "blue", "green", "pink"]}, "blue", 1.0),
        ("Maybe A, maybe D. The answer is A", {"correct_letter": "D"}, None, 0.0),
        ("no letter", {"correct_letter": "A"}, None, 0.0),
    ],
)
def test_gpqa(response, metadata, label, expected, graded):
    assert graded(response, label, rm="gpqa", metadata=metadata).reward == expected


def test_normalizers():
    assert math_normalize("\\dfrac12") == math_normalize("\\frac{1}{2}") == math_normalize("0.5")
    assert math_normalize("x = \\sqrt3") == "\\sqrt{3}"
    assert minerva_normalize("\\text{12 dollars}") == "12"


@pytest.mark.parametrize("name", ["math", "slime_math", "deepscaler", "dapo", "f1", "gpqa", "random"])
def test_contract(hub_pm, name):
    check_reward(hub_pm, name)


def test_rm_type_per_sample_overrides(graded):
    sample = graded("\\boxed{5}", "5", rm="dapo", metadata={"rm_type": "math"})
    assert sample.reward == 1.0


@pytest.mark.parametrize("name", ["math", "slime_math", "deepscaler", "dapo", "f1"])
def test_a_sample_without_label_is_invalid_not_zero(rlsdk_pm, name):
    """A forgotten --label-key must not score every sample 0: the reward is invalid, naming the fix."""
    from rlsdk import RolloutConfig
    from rlsdk_rm_hub import plugin

    rlsdk_pm.register(plugin)
    sample = Sample(response="</think> The answer is \\boxed{4}. Answer: 4", label=None)
    score_samples(rlsdk_pm, [sample], RolloutConfig(rm_type=name, reward_key="score"))
    assert sample.reward is None and sample.status is Sample.Status.FAILED
    assert "--label-key" in sample.metadata[REWARD_ERROR]


def test_warm_starts_one_worker_ahead_that_the_first_task_uses():
    """warm() starts one real worker in the background, once; a task sent while it is still importing
    waits for it rather than starting a second one, although the pool has room for two."""
    from rlsdk_rm_hub.pool import GraderPool

    pool = GraderPool(processes=2)
    try:
        pool.warm()
        pool.warm()
        first = pool.run("os:getpid", (), 10)
        assert [worker.process.pid for worker in pool._slots.idle] == [first]
        assert pool.run("os:getpid", (), 10) == first
    finally:
        pool.shutdown()


def test_the_math_reward_warms_the_shared_pool_on_first_call(args, graded):
    """A response the fast path settles still starts a worker for the answers to come."""
    import time

    from rlsdk_rm_hub import pool

    pool.shutdown_pool()
    assert graded("\\boxed{3}", "3").reward == 1.0
    shared = pool.get_pool(getattr(args, "grader_workers", None))
    deadline = time.monotonic() + 60
    while not shared._slots.idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(shared._slots.idle) == 1
