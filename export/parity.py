"""ONNX Runtime vs PyTorch on the same weights: graph outputs, then token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnxruntime as ort
import torch

from export.graphs import DECODER_INPUTS, example_inputs
from export.runtime import ORT_DTYPES
from model.search import pad_sources
from model.transformer import Transformer

FP32_TOLERANCE = 1e-4


@dataclass
class ParityReport:
    encoder_max_abs_diff: float
    decoder_max_abs_diff: float
    cases: int
    tolerance: float | None

    @property
    def passed(self) -> bool | None:
        if self.tolerance is None:
            return None
        return max(self.encoder_max_abs_diff, self.decoder_max_abs_diff) <= self.tolerance

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _max_diff(a: np.ndarray, b: torch.Tensor) -> float:
    return float(np.abs(a.astype(np.float32) - b.float().numpy()).max(initial=0.0))


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run with float inputs cast to the graph's own float type (fp16 graphs take fp16)."""
    types = {i.name: ORT_DTYPES.get(i.type) for i in session.get_inputs()}
    return session.run(None, {n: v.astype(types[n]) if types[n] else v for n, v in feeds.items()})


def random_sources(vocab_size: int, batch: int, length: int, rng: np.random.Generator) -> list[list[int]]:
    """Token ids of rows with different lengths (the first row has the full length)."""
    lengths = [length] + rng.integers(1, length + 1, size=batch - 1).tolist()
    return [rng.integers(4, vocab_size, size=n).tolist() for n in lengths]


def decoder_cases(model: Transformer, rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
    """Decoder-step inputs: several rows/sources/cache lengths, T = 0, and rows whose caches
    have different valid lengths in one batch."""
    cases = []
    for rows, sources, past, src_len in ((1, 1, 0, 1), (3, 2, 4, 5), (5, 3, 9, 17), (8, 8, 1, 3), (4, 1, 30, 40)):
        inputs = example_inputs(model, rows, sources, past, src_len)
        valid = rng.integers(0, past + 1, size=rows)
        inputs["cache_mask"] = torch.from_numpy(np.arange(past)[None, :] < valid[:, None])
        inputs["positions"] = torch.from_numpy(valid.astype(np.int64))
        src_valid = rng.integers(1, src_len + 1, size=sources)
        inputs["src_mask"] = torch.from_numpy(np.arange(src_len)[None, :] < src_valid[:, None])
        cases.append(inputs)
    return cases


@torch.no_grad()
def check_graphs(
    model: Transformer,
    encoder: ort.InferenceSession,
    decoder: ort.InferenceSession,
    real_sources: Sequence[Sequence[int]] = (),
    tolerance: float | None = FP32_TOLERANCE,
) -> ParityReport:
    """Max abs difference of encoder outputs and decoder-step log-probs / new cache entries
    between ONNX Runtime and PyTorch, over random inputs and (if given) real sentences."""
    model = model.eval()
    rng = np.random.default_rng(0)
    c = model.config
    batches = [random_sources(c.vocab_size, b, s, rng) for b, s in ((1, 1), (2, 7), (4, 33), (3, 120))]
    if real_sources:
        batches.append([list(s) for s in real_sources])
    encoder_diff = decoder_diff = 0.0
    cases = decoder_cases(model, rng)
    for sources in batches:
        src, mask = pad_sources(sources, c.pad_id, c.eos_id)
        memory, cross_k, cross_v = _run(encoder, {"src_tokens": src, "src_mask": mask})
        ref_memory = model.encode(torch.from_numpy(src), torch.from_numpy(mask))
        ref_k, ref_v = model.cross_kv(ref_memory)
        real = torch.from_numpy(mask)
        encoder_diff = max(encoder_diff, _max_diff(memory[mask], ref_memory[real]))
        encoder_diff = max(encoder_diff, _max_diff(cross_k, ref_k), _max_diff(cross_v, ref_v))
        # A decoder step over real encoder outputs: one row per source, first step and a later one.
        step = example_inputs(model, len(sources), len(sources), 0, src.shape[1])
        step.update(cross_k=ref_k, cross_v=ref_v, src_mask=real, source_index=torch.arange(len(sources)))
        step["tokens"] = torch.full((len(sources),), c.decoder_start_id)
        cases.append(step)
    for inputs in cases:
        outputs = _run(decoder, {name: inputs[name].numpy() for name in DECODER_INPUTS})
        reference = model.decode_step(*(inputs[name] for name in DECODER_INPUTS))
        decoder_diff = max(decoder_diff, *(_max_diff(o, r) for o, r in zip(outputs, reference, strict=True)))
    return ParityReport(encoder_diff, decoder_diff, len(batches) + len(cases), tolerance)
