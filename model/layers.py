"""Encoder and decoder layers (Vaswani et al. 2017, section 3.1 and 3.3)."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import MultiHeadAttention
from runtime.model_config import ModelConfig

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2  (equation 2)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.act = ACTIVATIONS[config.activation]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class Residual(nn.Module):
    """A sub-layer wrapped in residual + layer norm: post-norm LayerNorm(x + Sublayer(x))
    as in the paper, or pre-norm x + Sublayer(LayerNorm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.pre_norm = config.norm == "pre"

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.ffn = FeedForward(config)
        self.attn_block = Residual(config)
        self.ffn_block = Residual(config)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, mask)[0])
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, FFN."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config, cross=True)
        self.ffn = FeedForward(config)
        self.self_block = Residual(config)
        self.cross_block = Residual(config)
        self.ffn_block = Residual(config)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Tensor,
        past: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Returns the layer output and this call's new self-attention keys/values."""
        new_kv: list[tuple[Tensor, Tensor]] = []

        def self_attention(h: Tensor) -> Tensor:
            out, kv = self.self_attn(h, self_mask, past)
            new_kv.append(kv)
            return out

        x = self.self_block(x, self_attention)
        x = self.cross_block(x, lambda h: self.cross_attn.cross_attend(h, memory_kv, memory_mask))
        return self.ffn_block(x, self.ffn), new_kv[0]
