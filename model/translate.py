"""Reference decoding with PyTorch: ``python -m model.translate [--checkpoint DIR] [--beam N]``.

Reads source lines on stdin and writes one translation per line on stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common import flags
from common.flags import setting
from model.checkpoint import DEFAULT_CHECKPOINT, length_penalty, load_checkpoint
from model.transformer import Transformer
from runtime.search import LENGTH_PENALTY, DecodeBatch, pad_sources, source_searches, translate_in_batches
from runtime.tokenizer import Tokenizer


def top_candidates(log_probs: np.ndarray, k: int, eos_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a decoder step hands the search: each row's k best log-probabilities and ids (ties to the lower
    id, as ONNX TopK), and its eos log-probability."""
    ids = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(log_probs, ids, axis=1), ids, log_probs[:, eos_id : eos_id + 1]


class PrefixDecodeBatch(DecodeBatch):
    """Decoding without a cache: every step re-runs the decoder over each row's whole prefix."""

    def __init__(self, model: Transformer, memory: torch.Tensor) -> None:
        c = model.config
        super().__init__(self._prefix_step, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id)
        self.model, self.memory = model, memory
        self.prefix = np.zeros((0, 0), np.int64)

    def add(self, keys, searches, cross_k, cross_v, src_mask) -> None:
        if self.rows:
            raise NotImplementedError("the uncached reference decoder does not take sources mid-way")
        super().add(keys, searches, cross_k, cross_v, src_mask)
        self.prefix = np.zeros((self.rows, 0), np.int64)

    @staticmethod
    def _prefix_step(batch: PrefixDecodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch.prefix = np.concatenate([batch.prefix, batch.tokens[:, None]], axis=1)
        index = torch.tensor(batch.source_index)
        mask = torch.from_numpy(batch.src_mask[:, : batch.memory.shape[1]])[index]  # the slots' mask is padded
        logits = batch.model.decode(torch.from_numpy(batch.prefix), batch.memory[index], mask)
        log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1).numpy()
        return top_candidates(log_probs, int(batch.top_k[0]), batch.model.config.eos_id)

    def _select_rows(self, rows: np.ndarray) -> None:
        self.prefix = self.prefix[rows]

    def _keep_sources(self, positions: np.ndarray) -> None:
        super()._keep_sources(positions)
        self.memory = self.memory[torch.from_numpy(positions)]


class TorchTranslator:
    """Batched greedy / beam translation with the PyTorch model, with or without the KV cache."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        max_output_tokens: int = 256,
        length_penalty: float = LENGTH_PENALTY,
    ) -> None:
        self.model = model.eval()
        self.length_penalty = length_penalty
        self.tokenizer = tokenizer
        self.max_output_tokens = max_output_tokens
        self.device = next(model.parameters()).device

    def _step(self, batch: DecodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``Transformer.decode_step`` over the batch's cache, with the step contract of the ONNX graph:
        the new keys/values are written into the cache at each row's length."""
        c, cache, rows = self.model.config, batch.cache, batch.rows
        lengths = cache.live_lengths.astype(np.int64)
        longest = int(lengths.max(initial=0))
        past_k, past_v = (
            torch.stack([torch.from_numpy(b[:rows, :, :longest, : c.d_head]) for b in buffers])  # (L, R, H, T, d_k)
            for buffers in (cache.keys, cache.values)
        )
        inputs = {
            "tokens": torch.from_numpy(batch.tokens),
            "positions": torch.from_numpy(lengths),
            "past_k": past_k,
            "past_v": past_v,
            "cache_mask": torch.from_numpy(np.arange(longest)[None, :] < lengths[:, None]),
            "cross_k": torch.from_numpy(batch.sources.k),
            "cross_v": torch.from_numpy(batch.sources.v),
            "src_mask": torch.from_numpy(batch.src_mask),
            "source_index": torch.tensor(batch.source_index),
        }
        log_probs, new_k, new_v = self.model.decode_step(**{k: v.to(self.device) for k, v in inputs.items()})
        every_row = np.arange(rows)
        for buffers, new in ((cache.keys, new_k), (cache.values, new_v)):
            for buffer, entries in zip(buffers, new.cpu().numpy(), strict=True):
                buffer[every_row, :, lengths, : c.d_head] = entries[:, :, 0]
        return top_candidates(log_probs.cpu().numpy(), int(batch.top_k[0]), c.eos_id)

    @torch.inference_mode()
    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 1, use_cache: bool = True) -> list[list[int]]:
        c = self.model.config
        src, mask = pad_sources(sources, c.pad_id, c.eos_id)
        memory = self.model.encode(torch.from_numpy(src).to(self.device), torch.from_numpy(mask).to(self.device))
        if use_cache:
            cross_k, cross_v = (t.cpu().numpy() for t in self.model.cross_kv(memory))
            batch = DecodeBatch(self._step, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id)
        else:
            cross_k = cross_v = None
            batch = PrefixDecodeBatch(self.model, memory)
        searches = source_searches(sources, beam, c.eos_id, self.max_output_tokens, self.length_penalty)
        batch.add(range(len(sources)), searches, cross_k, cross_v, mask)
        results = batch.drain()
        return [results[i].tokens for i in range(len(sources))]

    def translate(self, texts: Sequence[str], beam: int = 1, batch_size: int = 64, use_cache: bool = True) -> list[str]:
        return translate_in_batches(
            self.tokenizer, texts, lambda ids: self.translate_ids(ids, beam, use_cache), batch_size
        )


@dataclass(frozen=True)
class ReferenceTranslation:
    checkpoint: Path = setting(DEFAULT_CHECKPOINT, "checkpoint folder")
    beam: int = setting(1, "beam size (1 = greedy)")
    batch_size: int = setting(64, "sentences per batch")
    max_output_tokens: int = setting(256, "the longest output per sentence, eos included")
    device: str = setting("cpu", "torch's device")
    length_penalty: float | None = setting(None, "beam search's α (default: the checkpoint's)")

    def __post_init__(self) -> None:
        if min(self.beam, self.batch_size, self.max_output_tokens) < 1:
            raise ValueError("--beam, --batch-size and --max-output-tokens must be at least 1")


def main(argv: Sequence[str] | None = None) -> int:
    args = flags.command(ReferenceTranslation, argv, "python -m model.translate", __doc__)
    model, tokenizer = load_checkpoint(args.checkpoint, args.device)
    alpha = length_penalty(args.checkpoint) if args.length_penalty is None else args.length_penalty
    translator = TorchTranslator(model, tokenizer, args.max_output_tokens, alpha)
    lines = [line.rstrip("\n") for line in sys.stdin]
    for out in translator.translate(lines, args.beam, args.batch_size):
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
