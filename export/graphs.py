"""The two ONNX graphs a model is served as: the encoder and one decoder step.

Encoder:  src_tokens (B, S) int64, src_mask (B, S) bool
          -> memory (B, S, D), cross_k / cross_v (L, B, H, S, d_k)   (traced from PyTorch)
Decoder:  one step for R rows over a cache written in place (written node by node from the
          weights: see export/decoder_step.py for its inputs and outputs).

B, S, R and the cache length are dynamic.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from export.decoder_step import build_decoder_step
from model.transformer import Transformer

ENCODER_INPUTS = ["src_tokens", "src_mask"]
ENCODER_OUTPUTS = ["memory", "cross_k", "cross_v"]
ENCODER_AXES = {
    "src_tokens": {0: "batch", 1: "src_len"},
    "src_mask": {0: "batch", 1: "src_len"},
    "memory": {0: "batch", 1: "src_len"},
    "cross_k": {1: "batch", 3: "src_len"},
    "cross_v": {1: "batch", 3: "src_len"},
}


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_tokens: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        memory = self.model.encode(src_tokens, src_mask)
        cross_k, cross_v = self.model.cross_kv(memory)
        return memory, cross_k, cross_v


def export_graphs(model: Transformer, folder: Path, opset: int) -> tuple[Path, Path]:
    """Write encoder.onnx (traced) and decoder.onnx (built from the weights), fp32 and unoptimized, into folder."""
    model = model.eval().float()
    encoder_path, decoder_path = folder / "encoder.onnx", folder / "decoder.onnx"
    src = torch.randint(4, model.config.vocab_size, (2, 7))
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[1, 5:] = False
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            EncoderGraph(model), (src, src_mask), str(encoder_path), input_names=ENCODER_INPUTS,
            output_names=ENCODER_OUTPUTS, dynamic_axes=ENCODER_AXES, opset_version=opset, dynamo=False,
        )  # fmt: skip
    onnx.save(build_decoder_step(model), str(decoder_path))
    return encoder_path, decoder_path
