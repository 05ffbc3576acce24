"""The call points: the rollout loop and rlsdk.testing call a plugin the same way, so a plugin that passes the
kit works in the loop, and a plugin that fails is named (plugin, distribution, group or sample) in both.

Regression tests for two bugs of issue 20: a dynamic filter that raised escaped the step as a bare exception
naming no plugin; async dynamic and buffer filters passed rlsdk.testing's checks but failed in the loop.
Generation runs on the FakeEngine of ``test_rollout_loop`` (see its docstring); the rest is real.
"""

from __future__ import annotations

import asyncio

import pytest

from rlsdk import BufferFilter, DynamicFilter, DynamicFilterOutput, OverSamplingFilter, PluginInfo, hookimpl
from rlsdk.errors import PluginCallError
from rlsdk.testing import check_buffer_filter, check_dynamic_filter, check_over_sampling_filter, make_group

from . import test_rollout_loop as loop

make_run = loop.make_run  # the rollout loop tests' fixture
step, prompts_of = loop.step, loop.prompts_of

DISTRIBUTION = PluginInfo(plugin="third_party", distribution="rl-plugin-third-party", version="1.2.0")


async def keep_even(args, samples, **kwargs):
    """An async dynamic filter: keeps groups of even-numbered prompts."""
    await asyncio.sleep(0)
    keep = int(samples[0].prompt.split()[0]) % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


def needs_a_key(args, samples, **kwargs):
    """Raises KeyError on groups of odd-numbered prompts, as a filter reading a missing metadata key does."""
    if int(samples[0].prompt.split()[0]) % 2:
        return samples[0].metadata["difficulty"] > 0
    return True


async def newest_first(args, rollout_id, buffer, num_samples):
    """An async buffer filter: serves the newest buffered groups first."""
    await asyncio.sleep(0)
    taken = buffer[len(buffer) - min(num_samples, len(buffer)):][::-1]
    del buffer[len(buffer) - len(taken):]
    return taken


class ThirdParty:
    @hookimpl
    def rlsdk_dynamic_filters(self):
        yield DynamicFilter(name="keep_even", func=keep_even)
        yield DynamicFilter(name="needs_a_key", func=needs_a_key)
        yield DynamicFilter(name="says_maybe", func=lambda args, samples: "maybe")

    @hookimpl
    def rlsdk_buffer_filters(self):
        yield BufferFilter(name="newest_first", func=newest_first)

    @hookimpl
    def rlsdk_over_sampling_filters(self):
        yield OverSamplingFilter(name="duplicates", func=lambda args, groups: groups + groups[:1])


@pytest.fixture
def third_party(rlsdk_pm):
    rlsdk_pm.register(ThirdParty(), "third_party", info=DISTRIBUTION)
    return rlsdk_pm


def test_a_raising_dynamic_filter_fails_its_group_named_and_the_step_goes_on(third_party, make_run):
    args, source, runtime, _ = make_run(n_prompts=4, dynamic_sampling_filter_path="needs_a_key",
                                        over_sampling_batch_size=4)
    out = step(args, source, runtime)
    m = out.metrics
    assert sorted(prompts_of(out.samples)) == ["0 fast|", "2 fast|"]  # groups settle as they finish: no order
    assert m["ledger/failed"] == 4 and m["ledger/entered"] == m["ledger/kept"] + m["ledger/failed"]
    error = sorted(m["rollout/failures"])[0]
    assert error.startswith("dynamic_filter 'needs_a_key' from rl-plugin-third-party 1.2.0 on group 1 "
                            "(samples 2, 3) raised KeyError: 'difficulty'"), error
    assert all(s.metadata["filter_error"] in m["rollout/failures"] for g in out.discarded for s in g)
    # the kit raises the very error the loop records
    with pytest.raises(PluginCallError, match="dynamic_filter 'needs_a_key' from rl-plugin-third-party 1.2.0 "
                                              "on group .* raised KeyError: 'difficulty'"):
        check_dynamic_filter(third_party, "needs_a_key", groups=[make_group([1.0], prompt="1 fast|")])


def test_a_filter_with_a_wrong_answer_is_named_alike_by_kit_and_loop(third_party, make_run):
    with pytest.raises(PluginCallError, match="'says_maybe' from rl-plugin-third-party 1.2.0 on group 0 .*returned "
                                              "str: expected DynamicFilterOutput or bool"):
        check_dynamic_filter(third_party, "says_maybe")
    args, source, runtime, _ = make_run(n_prompts=2, dynamic_sampling_filter_path="says_maybe",
                                        rollout_max_groups_per_step=2)
    out = step(args, source, runtime)
    assert out.samples == [] and out.metrics["ledger/failed"] == 4
    assert "on group 0 (samples 0, 1) returned str: expected DynamicFilterOutput or bool" in \
        out.metrics["rollout/failures"][0]

    with pytest.raises(PluginCallError, match="'duplicates' from rl-plugin-third-party 1.2.0 .*returned a group "
                                              "twice"):
        check_over_sampling_filter(third_party, "duplicates")
    args, source, runtime, _ = make_run(n_prompts=2, over_sampling_filter_path="duplicates")
    with pytest.raises(PluginCallError, match="'duplicates' from rl-plugin-third-party 1.2.0 .*returned a group "
                                              "twice"):
        step(args, source, runtime)


def test_an_async_dynamic_filter_passes_the_kit_and_works_in_the_loop(third_party, make_run):
    assert [v.keep for v in check_dynamic_filter(third_party, "keep_even",
                                                 groups=[make_group([1.0], prompt=f"{i} x|") for i in (2, 3)])] \
        == [True, False]
    args, source, runtime, _ = make_run(n_prompts=6, dynamic_sampling_filter_path="keep_even",
                                        over_sampling_batch_size=6)
    out = step(args, source, runtime)
    kept = [int(p.split()[0]) for p in prompts_of(out.samples)]
    assert len(kept) == 2 and all(n % 2 == 0 for n in kept)
    assert out.metrics["rollout/dynamic_filter/drop_odd"] >= 2 and out.metrics["ledger/failed"] == 0


def test_an_async_buffer_filter_passes_the_kit_and_works_in_the_loop(third_party, make_run):
    served = check_buffer_filter(third_party, "newest_first", num_samples=2)
    assert [g[0].group_index for g in served] == [4, 3]
    # 6 prompts, 4 pulled in step 0, 2 kept: the 2 surplus groups are buffered and served newest first
    args, source, runtime, _ = make_run(n_prompts=6, buffer_filter_path="newest_first")
    step(args, source, runtime)
    assert prompts_of(source.buffer) == ["2 fast|", "3 fast|"]
    out = step(args, source, runtime, rollout_id=1)
    assert prompts_of(out.samples) == ["3 fast|", "2 fast|"]
