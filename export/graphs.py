"""The two ONNX graphs a model is served as, both written node by node from the weights:

Encoder:  src_tokens (B, S) int64, src_mask (B, S) bool
          -> memory (B, S, D), cross_k / cross_v (L, B, H, S, d_k)   (export/encoder.py)
Decoder:  one step for R rows over a cache written in place (export/decoder_step.py).

B, S, R and the cache length are dynamic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from export.decoder_step import build_decoder_step
from export.encoder import build_encoder
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


def export_graphs(model: Transformer, folder: Path, dtype: type[np.floating] = np.float32) -> tuple[Path, Path]:
    """Write the encoder and decoder-step graphs of ``model`` (unoptimized) into folder: encoder.onnx and
    decoder.onnx for float32, encoder.fp16.onnx and decoder.fp16.onnx for float16."""
    suffix = "" if dtype == np.float32 else ".fp16"
    encoder_path, decoder_path = folder / f"encoder{suffix}.onnx", folder / f"decoder{suffix}.onnx"
    onnx.save(build_encoder(model, dtype), str(encoder_path))
    onnx.save(build_decoder_step(model, dtype), str(decoder_path))
    return encoder_path, decoder_path
