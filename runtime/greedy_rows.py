"""A batch's greedy bookkeeping over numpy (``GreedyRows``): when every source is greedy (one row each) and a run
makes one step, the step's tokens are checked for every row at once (eos, the longest output, and each stop
rule's cheap test, ``StopRule.may_stop_rows``); only the rows that end or that a rule must look at closer reach
their search's ``take``, and the others' searches ``append`` the token, which cannot end them. A step of 128 rows
then runs a numpy expression and a loop of appends instead of 128 ``take`` calls (runtime/batch.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from runtime.stops import StopRules

if TYPE_CHECKING:
    from runtime.batch import Placed


# From this many rows a greedy step is checked over numpy. Under load a server's batch changes its sources at
# almost every step, and each change makes the arrays again: at 32 clients of single sentences (batches of
# 4-20 rows) the arrays took 3.5% of a lane's time where the searches' own ``take`` calls took 0.1%
# (benchmarks/lane_profile.py); a steady batch of 128 rows spends 24-36 µs of host time per step instead of
# 59-60 (benchmarks/step_anatomy.py, runs stubbed; 2-core AMD EPYC).
MANY_ROWS = 64


class GreedyRows:
    """The arrays of one running batch's greedy sources, aligned with its layout's ``placed()`` list and made
    again whenever that list is a new one (a source joined, left or moved): each source's row, tokens taken,
    longest output and last tokens (as many as the stop rules read, each at its position modulo that)."""

    def __init__(self, eos_id: int, stop_rules: StopRules) -> None:
        self.eos_id, self.rules = eos_id, stop_rules
        self.window = max((rule.window for rule in stop_rules), default=0)
        self._placed: Sequence[Placed] | None = None

    def step(self, placed: Sequence[Placed], top_ids: np.ndarray, top_log_probs: np.ndarray) -> list[Placed]:
        """Each source's search takes its row's token and log-probability ((rows, 1) each); returns the
        sources that ended."""
        if placed is not self._placed:
            self._follow(placed)
        ids, log_probs = top_ids[self.rows, 0], top_log_probs[self.rows, 0]
        closer = (ids == self.eos_id) | (self.taken >= self.limits)
        if self.window:
            for rule in self.rules:
                closer |= rule.may_stop_rows(self.tails, ids)
            self.tails[self.order, self.taken % self.window] = ids  # the oldest goes
        self.taken += 1
        tokens, values, searches, finished = ids.tolist(), log_probs.tolist(), self.searches, []
        if not closer.any():
            for search, token, value in zip(searches, tokens, values, strict=True):
                search.append(token, value)
            return finished
        for i, (search, token, value, near) in enumerate(zip(searches, tokens, values, closer.tolist(), strict=True)):
            if not near:
                search.append(token, value)
            elif not search.take(token, value):
                finished.append(placed[i])
        return finished

    def _follow(self, placed: Sequence[Placed]) -> None:
        self._placed, count, window = placed, len(placed), self.window
        self.searches = [source.search for source in placed]
        self.rows = np.array([source.first_row for source in placed], np.int64)
        taken = [len(search.tokens) for search in self.searches]
        self.order, self.taken = np.arange(count), np.array(taken, np.int64)
        # a token with this many taken before it ends the row by length, as ``GreedySearch.take`` says
        self.limits = np.array([search.max_length - 1 for search in self.searches], np.int64)
        if window:
            tails = []
            for search, length in zip(self.searches, taken, strict=True):
                tail = [-1] * window
                for position in range(max(0, length - window), length):
                    tail[position % window] = search.tokens[position]
                tails.append(tail)
            self.tails = np.array(tails, np.int64).reshape(count, window)
