"""On-policy distillation (``opd_teacher``, ``opd_kl_coef``): a teacher engine scores the tokens the student
sampled, and every token's advantage loses ``opd_kl_coef`` times the reverse KL estimate
``log pi_student(y_t) - log pi_teacher(y_t)`` (slime's ``--opd-kl-coef``; on top of any estimator, so a
reward of 0 everywhere is pure distillation). The teacher is any engine: an SGLang-protocol server by URL, or
an engine plugin by name serving ``opd_teacher_load``; it scores at temperature 1 (``logprob_start_len``
with ``max_new_tokens: 0``, as the trust check does)."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from ..engines.engine import InferenceEngine
from ..plugins.calls import call_engine
from ..types import Sample
from .sync import engine_log_probs
from ..config import RolloutConfig

TEACHER_CONCURRENCY = 16
"""Samples the teacher scores at once."""


def open_teacher(args: RolloutConfig, pm: Any) -> InferenceEngine:
    """The teacher engine ``args.opd_teacher`` names (not started): a client of the URL, or the engine
    plugin of that name built with ``model = opd_teacher_load``."""
    spec = args.opd_teacher or ""
    if spec.startswith(("http://", "https://")):
        from ..engines.sglang_client import SGLangClient

        return SGLangClient(spec)
    if not args.opd_teacher_load:
        raise ValueError(
            f"--opd-teacher {spec}: an engine by name needs the teacher's model (--opd-teacher-load)"
        )
    teacher_args = args.replace(model=args.opd_teacher_load, hf_checkpoint=None)
    return call_engine(pm.resolve("engine", spec), teacher_args)


async def score_with_teacher(teacher: InferenceEngine, samples: list[Sample]) -> None:
    """Set each sample's ``teacher_log_probs``: the teacher's log-probs of its response tokens."""
    slots = asyncio.Semaphore(TEACHER_CONCURRENCY)

    async def score(sample: Sample) -> None:
        if sample.response_length == 0:
            sample.teacher_log_probs = []
            return
        async with slots:
            try:
                sample.teacher_log_probs = await engine_log_probs(teacher, sample)
            except Exception as exc:
                raise RuntimeError(
                    f"on-policy distillation: the teacher could not score sample {sample.group_index}/"
                    f"{sample.index}: {exc}"
                ) from exc

    await asyncio.gather(*(score(s) for s in samples))


def subtract_reverse_kl(
    advantages: list[torch.Tensor],
    student: list[torch.Tensor],
    teacher: list[Any],
    masks: list[torch.Tensor],
    coef: float,
) -> tuple[list[torch.Tensor], float]:
    """``advantages - coef * (student - teacher)`` per token, and the mean reverse KL over trained tokens;
    ``teacher`` holds each sample's teacher log-probs (lists or tensors)."""
    out, kls = [], []
    for i, (adv, own, other) in enumerate(zip(advantages, student, teacher, strict=True)):
        if other is None or len(other) != own.numel():
            raise ValueError(
                f"on-policy distillation: sample {i} has {0 if other is None else len(other)} teacher log-probs "
                f"for {own.numel()} response tokens (with --use-opd --opd-type sglang the reward post-process "
                "sets them: slime.rollout.on_policy_distillation.post_process_rewards)"
            )
        kl = own.float() - torch.as_tensor(other, dtype=torch.float32, device=own.device)
        out.append(adv - coef * kl.to(adv.dtype))
        kls.append(kl)
    mask = torch.cat(masks)
    mean = float((torch.cat(kls) * mask).sum() / mask.sum().clamp_min(1))
    return out, mean
