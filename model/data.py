"""Line-aligned parallel text, length filtering, token-budget batches bucketed by length."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from runtime.batch import pad_sources


@dataclass(frozen=True)
class Example:
    source: list[int]
    target: list[int]


def filter_by_length(
    sources: Sequence[list[int]], targets: Sequence[list[int]], max_len: int, max_ratio: float = 3.0
) -> list[Example]:
    """Pairs with both sides non-empty, at most max_len tokens, and a plausible length ratio."""
    kept = []
    for s, t in zip(sources, targets, strict=True):
        if (
            0 < len(s) <= max_len
            and 0 < len(t) <= max_len
            and max(len(s), len(t)) <= max_ratio * min(len(s), len(t)) + 5
        ):
            kept.append(Example(s, t))
    return kept


@dataclass
class Batch:
    src: Tensor  # (B, S) token ids, padded
    src_mask: Tensor  # (B, S) True on real tokens
    tgt_in: Tensor  # (B, T) bos + target
    tgt_out: Tensor  # (B, T) target + eos, pad elsewhere

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_out != 0).sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.src_mask, self.tgt_in, self.tgt_out)))


def collate(examples: Sequence[Example], pad: int, bos: int, eos: int) -> Batch:
    """Sources end in eos (as at inference, see ``pad_sources``); targets are shifted by bos."""
    src, src_mask = (torch.from_numpy(a) for a in pad_sources([e.source for e in examples], pad, eos))
    t_len = max(len(e.target) for e in examples) + 1
    tgt_in = torch.full((len(examples), t_len), pad, dtype=torch.long)
    tgt_out = torch.full((len(examples), t_len), pad, dtype=torch.long)
    for i, e in enumerate(examples):
        tgt_in[i, : len(e.target) + 1] = torch.tensor([bos, *e.target])
        tgt_out[i, : len(e.target) + 1] = torch.tensor([*e.target, eos])
    return Batch(src, src_mask, tgt_in, tgt_out)


def token_batches(examples: Sequence[Example], max_tokens: int, seed: int | None = None) -> list[list[Example]]:
    """Groups of examples whose padded size (rows × longest side + 1) stays within max_tokens.

    Examples are sorted by length (with a seeded shuffle among equal lengths)
    so each batch holds similar lengths and little padding; the batch order is
    shuffled when a seed is given.
    """
    rng = random.Random(seed)
    order = list(range(len(examples)))
    if seed is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: (len(examples[i].source), len(examples[i].target)))
    batches, current, longest = [], [], 0
    for i in order:
        e = examples[i]
        size = max(longest, len(e.source) + 1, len(e.target) + 1)
        if current and size * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, size = [], max(len(e.source) + 1, len(e.target) + 1)
        current.append(e)
        longest = size
    if current:
        batches.append(current)
    if seed is not None:
        rng.shuffle(batches)
    return batches


def iterate_batches(
    examples: Sequence[Example],
    max_tokens: int,
    special: tuple[int, int, int],
    seed: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[Batch]:
    """Collated batches; with several processes each takes every world_size-th batch."""
    groups = token_batches(examples, max_tokens, seed)
    usable = len(groups) - len(groups) % world_size if world_size > 1 else len(groups)
    for group in groups[rank:usable:world_size]:
        yield collate(group, *special)
