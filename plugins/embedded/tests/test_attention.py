"""The embedded engine's decode attention against transformers' SDPA path on the same inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlsdk_embedded.attention import full_attention_only, grouped_attention, sdpa_without_cudnn


def test_grouped_decode_matches_sdpa_with_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 8, 2, 11, 16
    query = torch.randn(batch, heads, 1, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, :4] = False  # left padding
    mask[2, :7] = False
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    ours, _ = grouped_attention(module, query, key, value, mask[:, None, None, :], scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask[:, None, None, :], scaling=0.3)
    assert ours.shape == theirs.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_padding_changes_nothing_for_the_real_tokens():
    """A row's output depends only on its unmasked keys: padding a row further leaves it unchanged."""
    torch.manual_seed(1)
    query = torch.randn(1, 4, 1, 8)
    key, value = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    full, _ = grouped_attention(
        module, query, key[:, :, 2:], value[:, :, 2:], torch.ones(1, 1, 1, 3, dtype=torch.bool)
    )
    padded_mask = torch.tensor([[[[False, False, True, True, True]]]])
    padded, _ = grouped_attention(module, query, key, value, padded_mask)
    torch.testing.assert_close(padded, full)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"layer_types": ["full_attention"] * 4}, True),
        ({"layer_types": ["full_attention", "sliding_attention"]}, False),
        ({"sliding_window": None}, True),
        ({"sliding_window": 4096, "use_sliding_window": False}, True),
        ({"sliding_window": 4096}, False),
    ],
)
def test_only_full_attention_models_use_it(config, expected):
    assert full_attention_only(SimpleNamespace(**config)) is expected


def test_cuda_steps_leave_cudnn_attention_out_and_restore_the_flags():
    """The flags are process-wide and readable without a GPU; the speed-up itself is measured on one."""
    before = torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()
    with sdpa_without_cudnn():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert (
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(),
    ) == before
