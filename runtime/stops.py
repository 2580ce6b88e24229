"""Stop rules: what ends a hypothesis besides its eos and its longest output, as objects the searches take
(runtime/search.py), as CTranslate2's logits processors and TGI's stopping criteria are. The searches ask each
rule, in order, after a hypothesis takes a token; beam search asks only where ``may_stop`` says it may end it.

- ``RepetitionGuard``: the runaway-output guard, which ends a hypothesis whose tail repeats an n-gram too often.
- ``stop_rules``: the rules the server and translate-file decode with, from their one setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class StopRule(Protocol):
    reason: str  # why a hypothesis it ends stopped (``Hypothesis.stopped``)
    window: int  # the most recent tokens of a row ``may_stop`` reads

    def may_stop(self, tail: Sequence[int], token: int) -> bool:
        """Whether ``token`` after a row whose last tokens are ``tail`` (``window`` of them at most) may end it:
        a cheap test; False means ``ends`` of the row with it is None."""

    def may_stop_rows(self, tails: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``may_stop`` for many rows at once (runtime/greedy_rows.py): ``tails`` (rows, window), each row's
        last tokens in any order (-1 where it has fewer), ``tokens`` (rows,) -> (rows,) bool."""

    def ends(self, tokens: Sequence[int]) -> int | None:
        """Whether the hypothesis ``tokens`` (its newest last) ends: None when it goes on, else how many of its
        tokens to drop from the end."""


StopRules = tuple[StopRule, ...]

# The runaway-output guard: an n-gram of up to REPEAT_NGRAM tokens repeated consecutively more than
# max_repeats times (after its first occurrence) ends its hypothesis, which keeps the first occurrence.
REPEAT_NGRAM = 4
MAX_REPEATS = 4  # the server's and translate-file's limit: "ha ha ha ha ha" passes, "ch" six times does not


@dataclass(frozen=True)
class RepetitionGuard:
    """The runaway-output guard, a stop rule (none: no guard, as the reference engines have none): a hypothesis
    whose tail repeats an n-gram of up to ``ngram`` tokens more than ``max_repeats`` times in a row ends there,
    cut back to the n-gram's first occurrence."""

    max_repeats: int = MAX_REPEATS
    ngram: int = REPEAT_NGRAM
    reason = "repetition"

    @property
    def window(self) -> int:
        return self.ngram

    def may_stop(self, tail: Sequence[int], token: int) -> bool:
        """Only a token among the row's last ``ngram`` can repeat an n-gram of its tail."""
        return token in tail

    def may_stop_rows(self, tails: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return (tails == tokens[:, None]).any(axis=1)

    def ends(self, tokens: Sequence[int]) -> int | None:
        return self.excess(tokens) or None

    def excess(self, tokens: Sequence[int]) -> int:
        """How many tokens to drop from the end: when the tail repeats an n-gram (n ≤ ngram) more than
        max_repeats times in a row after its first occurrence, all its occurrences but the first; 0 otherwise."""
        for n in range(1, self.ngram + 1):
            span = n * (self.max_repeats + 2)
            if len(tokens) < span or tokens[-1] != tokens[-1 - n]:  # the cheap test first
                continue
            start = len(tokens) - span
            if all(tokens[i] == tokens[i - n] for i in range(start + n, len(tokens))):
                while start >= n and tokens[start - n : start] == tokens[start : start + n]:
                    start -= n
                return len(tokens) - start - n
        return 0


def stop_rules(max_repeats: int) -> StopRules:
    """The rules of the server's and translate-file's ``--max-repeats`` (0: none)."""
    return (RepetitionGuard(max_repeats),) if max_repeats else ()
