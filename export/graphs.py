"""The two ONNX graphs a model is served as: the encoder and one decoder step.

Encoder:  src_tokens (B, S) int64, src_mask (B, S) bool
          -> memory (B, S, D), cross_k / cross_v (L, B, H, S, d_k)
Decoder:  tokens (B,), positions (B,), past_k / past_v (L, B, H, T, d_k), cache_mask (B, T),
          cross_k / cross_v (L, N, H, S, d_k), src_mask (N, S), source_index (B,)
          -> log_probs (B, V), new_k / new_v (L, B, H, 1, d_k)

B, N, S and T are dynamic; T may be 0 (the first step uses the same graph).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from model.transformer import Transformer

ENCODER_INPUTS = ["src_tokens", "src_mask"]
ENCODER_OUTPUTS = ["memory", "cross_k", "cross_v"]
DECODER_INPUTS = [
    "tokens",
    "positions",
    "past_k",
    "past_v",
    "cache_mask",
    "cross_k",
    "cross_v",
    "src_mask",
    "source_index",
]
DECODER_OUTPUTS = ["log_probs", "new_k", "new_v"]

ENCODER_AXES = {
    "src_tokens": {0: "batch", 1: "src_len"},
    "src_mask": {0: "batch", 1: "src_len"},
    "memory": {0: "batch", 1: "src_len"},
    "cross_k": {1: "batch", 3: "src_len"},
    "cross_v": {1: "batch", 3: "src_len"},
}
DECODER_AXES = {
    "tokens": {0: "rows"},
    "positions": {0: "rows"},
    "past_k": {1: "rows", 3: "past_len"},
    "past_v": {1: "rows", 3: "past_len"},
    "cache_mask": {0: "rows", 1: "past_len"},
    "cross_k": {1: "sources", 3: "src_len"},
    "cross_v": {1: "sources", 3: "src_len"},
    "src_mask": {0: "sources", 1: "src_len"},
    "source_index": {0: "rows"},
    "log_probs": {0: "rows"},
    "new_k": {1: "rows"},
    "new_v": {1: "rows"},
}


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_tokens: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        memory = self.model.encode(src_tokens, src_mask)
        cross_k, cross_v = self.model.cross_kv(memory)
        return memory, cross_k, cross_v


class DecoderStepGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.model.decode_step(*inputs)


def example_inputs(model: Transformer, rows: int = 3, sources: int = 2, past: int = 4, src_len: int = 5) -> dict:
    """Decoder-step inputs with distinct sizes on every dynamic axis (so none is specialized)."""
    c = model.config
    gen = torch.Generator().manual_seed(0)
    cache = (c.n_decoder_layers, rows, c.n_heads, past, c.d_head)
    cross = (c.n_decoder_layers, sources, c.n_heads, src_len, c.d_head)
    cache_mask = torch.ones(rows, past, dtype=torch.bool)
    cache_mask[-1, past // 2 :] = False
    return {
        "tokens": torch.randint(4, c.vocab_size, (rows,), generator=gen),
        "positions": cache_mask.sum(1),
        "past_k": torch.randn(cache, generator=gen),
        "past_v": torch.randn(cache, generator=gen),
        "cache_mask": cache_mask,
        "cross_k": torch.randn(cross, generator=gen),
        "cross_v": torch.randn(cross, generator=gen),
        "src_mask": torch.ones(sources, src_len, dtype=torch.bool),
        "source_index": torch.arange(rows) % sources,
    }


def export_graphs(model: Transformer, folder: Path, opset: int) -> tuple[Path, Path]:
    """Write encoder.onnx and decoder.onnx (fp32, unoptimized) into folder."""
    model = model.eval().float()
    encoder_path, decoder_path = folder / "encoder.onnx", folder / "decoder.onnx"
    src = torch.randint(4, model.config.vocab_size, (2, 7))
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[1, 5:] = False
    step_inputs = example_inputs(model)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            EncoderGraph(model), (src, src_mask), str(encoder_path), input_names=ENCODER_INPUTS,
            output_names=ENCODER_OUTPUTS, dynamic_axes=ENCODER_AXES, opset_version=opset, dynamo=False,
        )  # fmt: skip
        torch.onnx.export(
            DecoderStepGraph(model), tuple(step_inputs[name] for name in DECODER_INPUTS), str(decoder_path),
            input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS, dynamic_axes=DECODER_AXES,
            opset_version=opset, dynamo=False,
        )  # fmt: skip
    return encoder_path, decoder_path
