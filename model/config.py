"""The one configuration object every module of the model is built from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Activation = Literal["relu", "swish", "gelu"]
NormPlacement = Literal["post", "pre"]
PositionLayout = Literal["interleaved", "halves"]


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the encoder-decoder Transformer.

    ``positions="interleaved"`` is the paper's layout (sin on even, cos on odd
    dimensions); ``"halves"`` puts all sines first and all cosines second, as
    Marian / OPUS-MT models do.
    """

    vocab_size: int = 8000
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Activation = "relu"
    norm: NormPlacement = "post"
    positions: PositionLayout = "interleaved"
    scale_embeddings: bool = True
    tie_output: bool = True
    final_logits_bias: bool = False
    layer_norm_eps: float = 1e-5
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    decoder_start_id: int = 2

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even for sinusoidal positions")
        if self.activation not in ("relu", "swish", "gelu"):
            raise ValueError(f"activation={self.activation!r}: use relu, swish or gelu")
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm={self.norm!r}: use post or pre")
        if self.positions not in ("interleaved", "halves"):
            raise ValueError(f"positions={self.positions!r}: use interleaved or halves")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; is the checkpoint newer than this code?")
        return cls(**values)
