"""ONNX Runtime vs PyTorch on the same weights: graph outputs, then token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnxruntime as ort
import torch

from model.transformer import Transformer
from runtime.batch import pad_sources
from runtime.binding import run_in_place
from runtime.contract import ORT_DTYPES, STEP_OUTPUTS
from runtime.layout import row_groups

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


def example_inputs(model: Transformer, rows: int, sources: int, past: int, src_len: int) -> dict[str, torch.Tensor]:
    """``Transformer.decode_step`` inputs with random caches and distinct sizes on every axis."""
    c = model.config
    gen = torch.Generator().manual_seed(rows * 1000 + past)
    cache = (c.n_decoder_layers, rows, c.n_heads, past, c.d_head)
    cross = (c.n_decoder_layers, sources, c.n_heads, src_len, c.d_head)
    return {
        "tokens": torch.randint(4, c.vocab_size, (rows,), generator=gen),
        "positions": torch.full((rows,), past),
        "past_k": torch.randn(cache, generator=gen),
        "past_v": torch.randn(cache, generator=gen),
        "cache_mask": torch.ones(rows, past, dtype=torch.bool),
        "cross_k": torch.randn(cross, generator=gen),
        "cross_v": torch.randn(cross, generator=gen),
        "src_mask": torch.ones(sources, src_len, dtype=torch.bool),
        "source_index": torch.arange(rows) * sources // rows,  # each source's rows together, as the engine keeps them
    }


def decoder_cases(model: Transformer, rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
    """Decoder-step inputs: several rows/sources/cache lengths, an empty cache, and rows whose caches
    have different lengths in one batch (each row's valid entries first, as the engine keeps them)."""
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


def step_feeds(inputs: dict[str, torch.Tensor], session: ort.InferenceSession, k: int) -> dict[str, np.ndarray]:
    """The graph's feeds for ``decode_step`` inputs: each layer's cache in a buffer with spare slots
    (filled with garbage, which the step must neither read nor keep), the top k candidates asked for."""
    layers, rows, heads, past, d_head = inputs["past_k"].shape
    d_cache = next(i.shape[3] for i in session.get_inputs() if i.name == "past_key_0")
    lengths = inputs["positions"].numpy().astype(np.int32)
    source_index = inputs["source_index"].numpy()
    counts = np.bincount(source_index, minlength=len(inputs["src_mask"]))
    assert np.all(np.diff(source_index) >= 0) and np.all(counts > 0), "every source's rows, together"
    groups, row_position, _ = row_groups(counts)
    feeds = {
        "tokens": inputs["tokens"].numpy(),
        "lengths": lengths,
        "total_length": np.array(lengths.max(initial=0) + 1, np.int32),
        "groups": groups,
        "row_position": row_position,
        "src_mask": inputs["src_mask"].numpy().astype(np.int32),
        "top_k": np.array([k], np.int64),
        "row_scores": np.zeros((rows, 1)),
        "candidate_bias": np.where(
            np.arange(groups.shape[1])[None, :, None] < counts[:, None, None], 0.0, -np.inf
        ).repeat(k, axis=2),
    }
    for i in range(layers):
        for kind, tensor in (("key", inputs["past_k"][i]), ("value", inputs["past_v"][i])):
            buffer = np.full((rows, heads, past + 3, d_cache), 7.0, np.float32)
            buffer[:, :, :past, :d_head] = tensor.numpy()
            buffer[..., d_head:] = 0.0  # padded head columns hold zeros
            feeds[f"past_{kind}_{i}"] = buffer
        feeds[f"cross_key_{i}"], feeds[f"cross_value_{i}"] = inputs["cross_k"][i].numpy(), inputs["cross_v"][i].numpy()
    return feeds


def _step_difference(session: ort.InferenceSession, model: Transformer, inputs: dict[str, torch.Tensor]) -> float:
    """Max abs difference of every log-probability (the graph asked for all V candidates), the eos
    log-probability and each row's new cache entry; the step must keep every other slot as it was."""
    c = model.config
    feeds = step_feeds(inputs, session, c.vocab_size)
    outputs = run_in_place(session, feeds)
    log_probs, new_k, new_v = model.decode_step(**inputs)
    top, ids = outputs[STEP_OUTPUTS[0]].astype(np.float32), outputs[STEP_OUTPUTS[1]]
    every = np.zeros_like(top)
    np.put_along_axis(every, ids, top, axis=1)
    difference = max(_max_diff(every, log_probs), _max_diff(outputs[STEP_OUTPUTS[2]][:, 0], log_probs[:, c.eos_id]))
    lengths, rows = feeds["lengths"], np.arange(len(feeds["lengths"]))
    for i in range(c.n_decoder_layers):
        for kind, new in (("key", new_k), ("value", new_v)):
            before, after = feeds[f"past_{kind}_{i}"], outputs[f"present_{kind}_{i}"]
            written = after[rows, :, lengths, : c.d_head]  # (R, H, d_k)
            difference = max(difference, _max_diff(written, new[i][:, :, 0]))
            kept = np.ones(after.shape[:3], bool)
            kept[rows, :, lengths] = False
            if not np.array_equal(after[kept], before.astype(after.dtype)[kept]):
                raise AssertionError(f"the step changed cache slots other than the new entries (present_{kind}_{i})")
    return difference


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
        # At real tokens: the encoder leaves another token's keys/values in padding, which is masked.
        for ours, ref in ((cross_k, ref_k), (cross_v, ref_v)):
            encoder_diff = max(
                encoder_diff, _max_diff(ours.transpose(0, 1, 3, 2, 4)[:, mask], ref.transpose(2, 3)[:, real])
            )
        # A decoder step over real encoder outputs: one row per source, the first step.
        step = example_inputs(model, len(sources), len(sources), 0, src.shape[1])
        step.update(cross_k=ref_k, cross_v=ref_v, src_mask=real, source_index=torch.arange(len(sources)))
        step["tokens"] = torch.full((len(sources),), c.decoder_start_id)
        cases.append(step)
    for inputs in cases:
        decoder_diff = max(decoder_diff, _step_difference(decoder, model, inputs))
    return ParityReport(encoder_diff, decoder_diff, len(batches) + len(cases), tolerance)
