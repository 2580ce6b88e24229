from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from runtime.model_config import ModelConfig


def test_attention_equals_torch_without_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(scaled_dot_product_attention(q, k, v), expected, atol=1e-6)


@pytest.mark.parametrize("kind", ["causal", "padding"])
def test_attention_equals_torch_with_mask(kind):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 8) for _ in range(3))
    if kind == "causal":
        mask = causal_mask(6)
    else:
        mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(scaled_dot_product_attention(q, k, v, mask), expected, atol=1e-6)


def test_fully_masked_row_is_zero_not_nan():
    q, k, v = (torch.randn(1, 1, 2, 4) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v, torch.zeros(1, 1, 2, 2, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))


def test_multi_head_attention_equals_torch_multihead_attention():
    torch.manual_seed(2)
    config = ModelConfig(vocab_size=10, d_model=32, n_heads=4, dropout=0.0)
    ours = MultiHeadAttention(config).eval()
    theirs = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv_proj.weight)
        theirs.in_proj_bias.copy_(ours.qkv_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(3, 9, 32)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, 6:] = True  # torch's key_padding_mask is True where *ignored*
    expected, _ = theirs(x, x, x, key_padding_mask=padding, need_weights=False)
    actual, _ = ours(x, (~padding)[:, None, None, :])
    assert torch.allclose(actual, expected, atol=1e-5)


def test_cross_attention_equals_torch_multihead_attention():
    torch.manual_seed(3)
    config = ModelConfig(vocab_size=10, d_model=32, n_heads=4, dropout=0.0)
    ours = MultiHeadAttention(config, cross=True).eval()
    theirs = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x, memory = torch.randn(2, 4, 32), torch.randn(2, 7, 32)
    expected, _ = theirs(x, memory, memory, need_weights=False)
    actual = ours.cross_attend(x, ours.project_memory(memory), None)
    assert torch.allclose(actual, expected, atol=1e-5)
