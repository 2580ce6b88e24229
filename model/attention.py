"""Scaled dot-product and multi-head attention (Vaswani et al. 2017, section 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from runtime.model_config import ModelConfig


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V  (equation 1).

    q: (..., Tq, d_k), k and v: (..., Tk, d_k); mask: boolean, broadcastable to
    (..., Tq, Tk), True where a query may attend. A fully masked row yields zeros
    rather than NaN so padded query rows stay finite.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask  # a fully masked row becomes 0 instead of uniform
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v  # (..., Tq, d_k)


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """(T, T) boolean mask: position t attends to positions ≤ t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O  (section 3.2.2).

    Self-attention projects Q, K and V with one fused matrix; cross-attention
    projects Q from the decoder and K, V (fused) from the encoder memory, so the
    memory's keys and values can be computed once per source and reused.
    """

    def __init__(self, config: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.d_head = config.d_head
        self.cross = cross
        if cross:
            self.q_proj = nn.Linear(d, d)
            self.kv_proj = nn.Linear(d, 2 * d)
        else:
            self.qkv_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.dropout_p = config.attention_dropout

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head)  # (B, T, D)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output, each (B, H, S, d_k)."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        p = self.dropout_p if self.training else 0.0
        return self.out_proj(self.merge_heads(scaled_dot_product_attention(q, k, v, mask, p)))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        past: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Self-attention over x (B, T, D), after the cached past keys/values if given.

        Returns the output (B, T, D) and this call's own keys/values, each
        (B, H, T, d_k), for the caller to append to its cache. ``mask`` covers
        (past + T) keys.
        """
        q, k, v = (self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        return self.attend(q, keys, values, mask), (k, v)

    def cross_attend(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
        """Attention of decoder states x (B, T, D) over precomputed memory keys/values."""
        q = self.split_heads(self.q_proj(x))
        return self.attend(q, memory_kv[0], memory_kv[1], mask)
