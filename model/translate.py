"""Reference decoding with PyTorch: ``python -m model.translate [--checkpoint DIR] [--beam N]``.

Reads source lines on stdin and writes one translation per line on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from model.search import DecodeBatch, decode, pad_sources, translate_in_batches
from model.tokenizer import Tokenizer
from model.transformer import Transformer


class PrefixDecodeBatch(DecodeBatch):
    """Decoding without a cache: every step re-runs the decoder over each row's whole prefix."""

    def __init__(self, model: Transformer, memory: torch.Tensor) -> None:
        c = model.config
        super().__init__(None, c.n_decoder_layers, c.n_heads, c.d_head, c.decoder_start_id)
        self.model, self.memory = model, memory
        self.prefix = np.zeros((0, 0), np.int64)

    def add(self, keys, searches, cross_k, cross_v, src_mask) -> None:
        if self.rows:
            raise NotImplementedError("the uncached reference decoder does not take sources mid-way")
        super().add(keys, searches, cross_k, cross_v, src_mask)
        self.prefix = np.zeros((self.rows, 0), np.int64)

    def _run_step(self) -> np.ndarray:
        self.prefix = np.concatenate([self.prefix, self.tokens[:, None]], axis=1)
        index = torch.from_numpy(self.source_index)
        mask = torch.from_numpy(self.src_mask[:, : self.memory.shape[1]])[index]  # the slots' mask is padded
        logits = self.model.decode(torch.from_numpy(self.prefix), self.memory[index], mask)
        return torch.log_softmax(logits[:, -1].float(), dim=-1).numpy()

    def _select_rows(self, rows: np.ndarray) -> None:
        self.prefix = self.prefix[rows]
        self.source_index = self.source_index[rows]


class TorchTranslator:
    """Batched greedy / beam translation with the PyTorch model, with or without the KV cache."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_output_tokens: int = 256) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_output_tokens = max_output_tokens
        self.device = next(model.parameters()).device

    def _step(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        args = {name: torch.from_numpy(value).to(self.device) for name, value in inputs.items()}
        return tuple(t.cpu().numpy() for t in self.model.decode_step(**args))

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
        return decode(batch, cross_k, cross_v, mask, sources, beam, c.eos_id, self.max_output_tokens)

    def translate(self, texts: Sequence[str], beam: int = 1, batch_size: int = 64, use_cache: bool = True) -> list[str]:
        return translate_in_batches(
            self.tokenizer, texts, lambda ids: self.translate_ids(ids, beam, use_cache), batch_size
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="checkpoint folder")
    parser.add_argument("--beam", type=int, default=1, help="beam size (1 = greedy)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error("--beam must be at least 1")
    model, tokenizer = load_checkpoint(args.checkpoint, args.device)
    translator = TorchTranslator(model, tokenizer, args.max_output_tokens)
    lines = [line.rstrip("\n") for line in sys.stdin]
    for out in translator.translate(lines, args.beam, args.batch_size):
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
