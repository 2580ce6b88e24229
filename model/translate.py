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
from runtime.batch import DecodeBatch, EncodedSources, RowShape, StepInputs, pad_sources
from runtime.compact_rows import CompactRows
from runtime.contract import layer_names
from runtime.model_config import ModelConfig
from runtime.offline import translate_in_batches
from runtime.search import LENGTH_PENALTY, Decoding, default_max_output
from runtime.tokenizer import Tokenizer


def top_candidates(log_probs: np.ndarray, k: int, eos_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a decoder step hands the search: each row's k best log-probabilities and ids (ties to the lower
    id, as ONNX TopK), and its eos log-probability."""
    ids = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(log_probs, ids, axis=1), ids, log_probs[:, eos_id : eos_id + 1]


class PrefixRows(CompactRows):
    """Decoding without a cache: every step re-runs the decoder over each row's whole prefix, which the rows
    keep as they are selected (``prefix_step`` is the batch's step function)."""

    def __init__(self, model: Transformer, memory: torch.Tensor) -> None:
        c = model.config
        super().__init__(row_shape(c))
        self.model, self.memory = model, memory
        self.prefix = np.zeros((0, 0), np.int64)

    def add(self, keys, searches, encoded, overrun):
        if self.rows:
            raise NotImplementedError("the uncached reference decoder does not take sources mid-way")
        super().add(keys, searches, encoded, overrun)
        self.prefix = np.zeros((self.rows, 0), np.int64)

    def prefix_step(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feeds = inputs.feeds
        self.prefix = np.concatenate([self.prefix, feeds["tokens"][:, None]], axis=1)
        index = torch.from_numpy(source_index(feeds))
        mask = torch.from_numpy(feeds["src_mask"][:, : self.memory.shape[1]] != 0)[index]  # slots are padded
        logits = self.model.decode(torch.from_numpy(self.prefix), self.memory[index], mask)
        log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1).numpy()
        return top_candidates(log_probs, int(feeds["top_k"][0]), self.model.config.eos_id)

    def _select_rows(self, rows: Sequence[int]) -> None:
        self.prefix = self.prefix[rows]

    def _keep_sources(self, positions: list[int]) -> None:
        super()._keep_sources(positions)
        self.memory = self.memory[torch.tensor(positions, dtype=torch.int64)]


def row_shape(config: ModelConfig) -> RowShape:
    """What a row of the model's batch holds, its cache in float32 with the model's head size."""
    return RowShape(config.n_decoder_layers, config.n_heads, config.d_head, config.decoder_start_id)


def source_index(feeds: dict) -> np.ndarray:
    """Each row's source, from the step's ``row_position`` (source · G + position in its group of G rows)."""
    return feeds["row_position"] // feeds["groups"].shape[1]


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

    def _step(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``Transformer.decode_step`` over the step's feeds, with the step contract of the ONNX graph: the new
        keys/values are written into the cache (the feeds' views of it) at each row's length."""
        c, feeds, rows = self.model.config, inputs.feeds, inputs.rows
        layers = c.n_decoder_layers
        lengths = feeds["lengths"].astype(np.int64)
        longest = int(lengths.max(initial=0))
        past, cross = ([feeds[name] for name in layer_names(kind, layers)] for kind in ("past", "cross"))
        keys, values = past[0::2], past[1::2]  # past_key_0, past_value_0, past_key_1, ...
        past_k, past_v = (
            torch.stack([torch.from_numpy(b[:rows, :, :longest, : c.d_head]) for b in buffers])  # (L, R, H, T, d_k)
            for buffers in (keys, values)
        )
        cross_k, cross_v = (torch.from_numpy(np.stack(cross[part::2])) for part in (0, 1))  # (L, N, H, S, d_k)
        inputs = {
            "tokens": torch.from_numpy(feeds["tokens"]),
            "positions": torch.from_numpy(lengths),
            "past_k": past_k,
            "past_v": past_v,
            "cache_mask": torch.from_numpy(np.arange(longest)[None, :] < lengths[:, None]),
            "cross_k": cross_k,
            "cross_v": cross_v,
            "src_mask": torch.from_numpy(feeds["src_mask"] != 0),
            "source_index": torch.from_numpy(source_index(feeds)),
        }
        log_probs, new_k, new_v = self.model.decode_step(**{k: v.to(self.device) for k, v in inputs.items()})
        every_row = np.arange(rows)
        for buffers, new in ((keys, new_k), (values, new_v)):
            for buffer, entries in zip(buffers, new.cpu().numpy(), strict=True):
                buffer[every_row, :, lengths, : c.d_head] = entries[:, :, 0]
        return top_candidates(log_probs.cpu().numpy(), int(feeds["top_k"][0]), c.eos_id)

    @torch.inference_mode()
    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 1, use_cache: bool = True) -> list[list[int]]:
        c = self.model.config
        src, mask = pad_sources(sources, c.pad_id, c.eos_id)
        memory = self.model.encode(torch.from_numpy(src).to(self.device), torch.from_numpy(mask).to(self.device))
        decoding = Decoding(c.eos_id, self.length_penalty)
        if use_cache:
            cross_k, cross_v = (t.cpu().numpy() for t in self.model.cross_kv(memory))
            rows = CompactRows(row_shape(c))
            batch = DecodeBatch(self._step, decoding, rows)
        else:
            cross_k = cross_v = None
            rows = PrefixRows(self.model, memory)
            batch = DecodeBatch(rows.prefix_step, decoding, rows)
        limits = [default_max_output(len(source), self.max_output_tokens) for source in sources]
        batch.add(range(len(sources)), EncodedSources(cross_k, cross_v, mask), [beam] * len(sources), limits)
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
