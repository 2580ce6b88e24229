"""The memory budget: what an admitted sentence is expected to hold while it decodes, and whether more
fits. Pure bookkeeping (no threads, no ONNX Runtime): the scheduler calls it under its lock.

A sentence reserves its cross-attention keys/values and the self-attention cache of its predicted
output length (the model's measured output/input ratio with a margin); an encoder batch also reserves
its attention scores while it runs. Nothing is evicted mid-way, so admission is where the budget holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from server.interface import Memory

# Output/input tokens assumed before a model's first sentence finished (Multi30k en→de: about 1.1-1.2).
INITIAL_TARGET_RATIO = 1.3
# The prediction's margin over the measured ratio, and tokens added for short sentences, whose ratio
# varies most (test_2016_flickr: under 1% of sentences outgrew it).
PREDICTION_MARGIN = 1.25
PREDICTION_SLACK_TOKENS = 8
# The ratio learns from each finished sentence with this weight (about the last 50 sentences count).
RATIO_WEIGHT = 0.02


class MemoryBudget:
    def __init__(self, budget_bytes: int, models: Mapping[str, Memory]) -> None:
        """``models``: each model's sizes by its name (``Engine.memory``)."""
        self.budget_bytes = budget_bytes
        self.models = models
        self.reserved_bytes = 0  # what the admitted sentences reserved
        self.target_ratio = {model: INITIAL_TARGET_RATIO for model in models}  # output/input tokens, learned

    def estimate(self, model: str, source_tokens: int, beam: int, max_output: int) -> tuple[int, int]:
        """(bytes reserved while decoding, predicted output tokens) of one sentence on ``model``."""
        expected = self.target_ratio[model] * source_tokens
        predicted = min(max_output, int(expected * PREDICTION_MARGIN) + PREDICTION_SLACK_TOKENS)
        return self.models[model].sequence_bytes(source_tokens, predicted, beam), predicted

    def peak_bytes(self, model: str, reserved: int, source_tokens: int) -> int:
        """What one sentence needs at its peak: its reservation and its encoder call's scores."""
        return reserved + self.models[model].encoder_scores_bytes(1, source_tokens)

    def largest_peak(self, model: str, sentences: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """(index, peak bytes) of the sentence (reservation, source tokens) that needs the most at its peak."""
        peaks = [self.peak_bytes(model, reserved, tokens) for reserved, tokens in sentences]
        largest = max(range(len(peaks)), key=peaks.__getitem__)
        return largest, peaks[largest]

    def fits(self, model: str, reservations: Sequence[int], longest: int) -> bool:
        """Whether a group of sentences (their reservations, the longest's source tokens) can be encoded
        together and admitted now."""
        scores = self.models[model].encoder_scores_bytes(len(reservations), longest)
        return self.reserved_bytes + sum(reservations) + scores <= self.budget_bytes

    def encoding_bytes(self, model: str, source_tokens: Sequence[int]) -> int:
        """What an encoder call of sentences of ``source_tokens`` holds while it runs: reserved from admission
        until it ends, so that two lanes do not both count on the same room for their encoders."""
        return self.models[model].encoder_scores_bytes(len(source_tokens), max(source_tokens)) if source_tokens else 0

    def reserve(self, reserved: int) -> None:
        self.reserved_bytes += reserved

    def release(self, reserved: int) -> None:
        self.reserved_bytes -= reserved

    def learn(self, model: str, source_tokens: int, output_tokens: int) -> None:
        """A finished sentence's output/input ratio (eos counted on both sides) moves its model's."""
        ratio = (output_tokens + 1) / (source_tokens + 1)
        self.target_ratio[model] = (1 - RATIO_WEIGHT) * self.target_ratio[model] + RATIO_WEIGHT * ratio
