"""Reference decoding with PyTorch: ``python -m model.translate [--checkpoint DIR] [--beam N]``.

Reads source lines on stdin and writes one translation per line on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from model.search import CachedDecoderState, KVCache, pad_sources, search, translate_in_batches
from model.tokenizer import Tokenizer
from model.transformer import Transformer


@dataclass
class PrefixDecoderState:
    """Decoding without a cache: every step re-runs the decoder over each row's whole prefix."""

    model: Transformer
    memory: torch.Tensor  # (N, S, D)
    src_mask: torch.Tensor  # (N, S)
    source_index: np.ndarray  # (R,)
    prefix: np.ndarray  # (R, t)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.prefix = np.concatenate([self.prefix, tokens[:, None]], axis=1)
        index = torch.from_numpy(self.source_index)
        logits = self.model.decode(torch.from_numpy(self.prefix), self.memory[index], self.src_mask[index])
        return torch.log_softmax(logits[:, -1].float(), dim=-1).numpy()

    def select(self, rows: np.ndarray) -> None:
        self.source_index, self.prefix = self.source_index[rows], self.prefix[rows]


class TorchTranslator:
    """Batched greedy / beam translation with the PyTorch model, with or without the KV cache."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, max_output_tokens: int = 256) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_output_tokens = max_output_tokens

    def _step(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        args = {name: torch.from_numpy(value) for name, value in inputs.items()}
        log_probs, new_k, new_v = self.model.decode_step(**args)
        return log_probs.numpy(), new_k.numpy(), new_v.numpy()

    @torch.inference_mode()
    def translate_ids(self, sources: Sequence[Sequence[int]], beam: int = 1, use_cache: bool = True) -> list[list[int]]:
        c = self.model.config
        src, mask = (torch.from_numpy(a) for a in pad_sources(sources, c.pad_id, c.eos_id))
        memory = self.model.encode(src, mask)
        rows = len(sources) * beam
        source_index = np.repeat(np.arange(len(sources)), beam)
        if use_cache:
            cross_k, cross_v = self.model.cross_kv(memory)
            cache = KVCache.empty(c.n_decoder_layers, rows, c.n_heads, c.d_head)
            state = CachedDecoderState(self._step, cross_k.numpy(), cross_v.numpy(), mask.numpy(), source_index, cache)
        else:
            state = PrefixDecoderState(self.model, memory, mask, source_index, np.zeros((rows, 0), np.int64))
        return search(state, sources, beam, c.decoder_start_id, c.eos_id, self.max_output_tokens)

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
