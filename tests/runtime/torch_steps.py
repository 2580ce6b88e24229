"""A running batch over PyTorch's cached decoder step, and sources for it: what the batch's tests share."""

from __future__ import annotations

import torch

from model.transformer import Transformer
from model.translate import TorchTranslator, row_shape
from runtime.batch import DecodeBatch, EncodedSources, pad_sources
from runtime.compact_rows import CompactRows
from runtime.search import Decoding

SOURCES = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19], [20, 21]]


def encode(model: Transformer, sources: list[list[int]]) -> EncodedSources:
    c = model.config
    src, mask = pad_sources(sources, c.pad_id, c.eos_id)
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(torch.from_numpy(src), torch.from_numpy(mask)))
    return EncodedSources(cross_k.numpy(), cross_v.numpy(), mask)


def torch_batch(model: Transformer, translator: TorchTranslator) -> DecodeBatch:
    """A running batch over PyTorch's cached decoder step."""
    c = model.config
    rows = CompactRows(row_shape(c))
    return DecodeBatch(translator._step, Decoding(c.eos_id), rows)
