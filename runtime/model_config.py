"""The one configuration object every module of the model is built from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from common import flags
from common.flags import setting

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

    vocab_size: int = setting(8000, "target vocabulary size (shared with the source; training: the tokenizer's)")
    d_model: int = setting(256, "model width")
    n_heads: int = setting(4, "attention heads (divide d_model)")
    n_encoder_layers: int = setting(3, "encoder layers")
    n_decoder_layers: int = setting(3, "decoder layers")
    d_ff: int = setting(1024, "the feed-forward layers' inner width")
    dropout: float = setting(0.1, "dropout on sublayer outputs and embeddings (section 5.4)")
    attention_dropout: float = setting(0.0, "dropout on attention weights")
    activation: Activation = setting("relu", "the feed-forward activation")
    norm: NormPlacement = setting("post", "layer norm after each residual (the paper) or before each sublayer")
    positions: PositionLayout = setting("interleaved", "sinusoid layout: the paper's, or Marian's halves")
    scale_embeddings: bool = setting(True, "multiply embeddings by sqrt(d_model) (section 3.4)")
    tie_output: bool = setting(True, "the output projection is the embedding matrix (section 3.4)")
    final_logits_bias: bool = setting(False, "a learned bias on the logits (Marian)")
    layer_norm_eps: float = setting(1e-5, "layer norm's epsilon")
    pad_id: int = setting(0, flag=False)  # the ids are the tokenizer's, set by code
    unk_id: int = setting(1, flag=False)
    bos_id: int = setting(2, flag=False)
    eos_id: int = setting(3, flag=False)
    decoder_start_id: int = setting(2, flag=False)

    def __post_init__(self) -> None:
        problems = flags.choice_problems(self)
        if self.d_model % self.n_heads:
            problems.append(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2:
            problems.append(f"d_model={self.d_model} must be even for sinusoidal positions")
        if problems:
            raise ValueError("; ".join(problems))

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
