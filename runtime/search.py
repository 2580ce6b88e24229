"""The searches of one source, in numpy and plain Python: what each decoder step's candidates become.

- ``GreedySearch`` / ``BeamSearch``: each step a search receives the best candidates of its live rows and says
  which rows go on (by origin) with which tokens; it is done when it returns no rows, with a ``Hypothesis``: the
  tokens, a confidence score and why it stopped.
- Besides eos and its longest output, a search ends a hypothesis by the stop rules it takes (runtime/stops.py),
  as CTranslate2's logits processors and TGI's stopping criteria: the runaway-output guard among them.
- ``Search`` is what the running batch asks of each; ``OneRowSearch`` (greedy's ``take``) and ``RankedSearch``
  (beam search's ``advance_ranked``) add what it asks of one width only.
- ``Decoding``: how a batch's searches are made (the model's eos, beam search's length penalty, the stop rules).

The running batch that steps them is runtime/batch.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from runtime.stops import StopRules


def default_max_output(source_tokens: int, cap: int) -> int:
    """Longest translation searched for a source of ``source_tokens`` tokens (its eos not counted): the output
    counts its own eos, as does ``cap``."""
    return min(cap, 2 * (source_tokens + 1) + 10)


class Hypothesis(NamedTuple):
    """A finished translation of one source."""

    tokens: list[int]  # without start and eos
    # Confidence: the log-probability of every token the search chose for it (eos included when it ended
    # with one) divided by their number, i.e. the log of their geometric-mean probability; 0 is certain.
    score: float
    stopped: str  # "eos"; "length": the longest output allowed; "repetition": the runaway-output guard
    # Beam search's other finished hypotheses of the source, best first, each output once and none the
    # same as this one's (LibreTranslate's alternatives); greedy search has none.
    alternatives: tuple[Hypothesis, ...] = ()


@runtime_checkable
class Search(Protocol):
    """What the running batch (runtime/batch.py) asks of every source's search."""

    rows: int  # live rows this source occupies
    width: int  # the most rows it may occupy (the beam)
    top_k: int  # candidates per row it needs from a step
    max_length: int  # tokens it may produce, eos included
    scores: Sequence[float]  # each live row's score so far, which the step graph's search head ranks by

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """This step's best candidates of its live rows, (rows, top_k) each, best first (equal ones lower
        token first, as ONNX TopK returns them), and each row's eos log-probability (rows,) -> (origin of
        each next row, its token); none when done."""

    def result(self) -> Hypothesis: ...


@runtime_checkable
class OneRowSearch(Search, Protocol):
    """A search of one row (width 1): when every source's is, the batch hands each its row's tokens, one per step
    the run made, without ranking."""

    tokens: list[int]  # taken so far

    def take(self, token: int, log_prob: float) -> bool:
        """The step's best token and its log-probability: whether the row goes on."""

    def append(self, token: int, log_prob: float) -> None:
        """``take`` of a token known to go on (not eos, under the longest output, no stop rule's cheap test)."""


@runtime_checkable
class RankedSearch(Search, Protocol):
    """A search of several rows (width > 1): the batch hands it the candidates the step graph's search head
    ranked over its rows, when the step ranks them."""

    def advance_ranked(
        self, values: Sequence[float], origins: Sequence[int], tokens: Sequence[int], eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """This step's best extensions over the live rows, best first (their scores, rows and tokens), and each
        row's eos log-probability -> (origin of each next row, its token); none when done."""


@dataclass
class GreedySearch:
    max_length: int  # tokens including eos
    eos_id: int
    stop_rules: StopRules = ()  # asked after each token it takes (runtime/stops.py)
    tokens: list[int] = field(default_factory=list)
    rows: int = 1
    width: int = 1
    top_k: int = 1
    log_prob: float = 0.0  # of the tokens chosen so far
    stopped: str = ""
    scores = (0.0,)  # the row's score for the step graph's search head, which greedy does not read

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        token = int(top_ids[0, 0])
        if self.take(token, float(top_log_probs[0, 0])):
            return _ROW_ZERO, top_ids[0, :1]
        return _NO_ROWS, _NO_ROWS

    def take(self, token: int, log_prob: float) -> bool:
        """The step's best token and its log-probability: whether the row goes on."""
        if token == self.eos_id or len(self.tokens) + 1 >= self.max_length:
            self.stopped = "eos" if token == self.eos_id else "length"
            if token == self.eos_id:
                self.log_prob += log_prob
            self.rows = 0
            return False
        self.tokens.append(token)
        self.log_prob += log_prob
        for rule in self.stop_rules:
            if (drop := rule.ends(self.tokens)) is not None:
                scored = len(self.tokens)
                del self.tokens[scored - drop :]
                self.log_prob *= len(self.tokens) / scored  # the kept tokens' share, at the same mean
                self.stopped, self.rows = rule.reason, 0
                return False
        return True

    def append(self, token: int, log_prob: float) -> None:
        self.tokens.append(token)
        self.log_prob += log_prob

    def result(self) -> Hypothesis:
        chosen = len(self.tokens) + (self.stopped == "eos")
        return Hypothesis(self.tokens, self.log_prob / max(chosen, 1), self.stopped)


_NO_ROWS = np.zeros(0, np.int64)
_ROW_ZERO = np.zeros(1, np.int64)


# GNMT's length penalty α for beam search; a checkpoint may name its own, tuned on validation data
# ("decoding": {"length_penalty": α} in config.json, carried into the export's manifest).
LENGTH_PENALTY = 0.6


def length_normalized(score: float, length: int, alpha: float) -> float:
    """GNMT length penalty: score / ((5 + length) / 6)^alpha."""
    return score / (((5.0 + length) / 6.0) ** alpha)


@dataclass
class BeamSearch:
    """Beam search for one source. It starts from one row; each step takes the 2·beam
    best extensions: those ending in eos within the top beam ranks are finished
    (scored with the GNMT length penalty), the best non-eos ones form the next
    beam. Done with ``beam`` finished hypotheses or at max_length.

    The 2·beam best extensions over all rows are among each row's own 2·beam best,
    which is all a step hands over. Ties go to the lower row, then the lower token.

    A step's few rows are kept in plain lists (a numpy call on four numbers costs more than the work): each
    step's rows as back-pointers to the step before, read back into a row's tokens only when it ends."""

    beam: int
    max_length: int
    eos_id: int
    alpha: float = LENGTH_PENALTY
    stop_rules: StopRules = ()  # asked of each extension that may go on (runtime/stops.py)
    scores: list[float] = field(default_factory=lambda: [0.0])  # each live row's (float64, as the step's)
    # steps[t] = (origins, tokens): after step t, row i continues row origins[i] of the step before with tokens[i]
    steps: list[tuple[list[int], list[int]]] = field(default_factory=list)
    tails: list[tuple[int, ...]] = field(default_factory=lambda: [()])  # each row's last tokens the rules read
    # (length-normalized score, hypothesis) of each finished hypothesis
    finished: list[tuple[float, Hypothesis]] = field(default_factory=list)
    rows: int = 1
    window: int = field(init=False)  # the most recent tokens any stop rule reads: each row's tail keeps them

    def __post_init__(self) -> None:
        self.window = max((rule.window for rule in self.stop_rules), default=0)

    @property
    def width(self) -> int:
        return self.beam

    @property
    def top_k(self) -> int:
        return 2 * self.beam

    def output(self, row: int) -> list[int]:
        """A live row's tokens so far, read back through the steps."""
        tokens = []
        for origins, step_tokens in reversed(self.steps):
            tokens.append(step_tokens[row])
            row = origins[row]
        tokens.reverse()
        return tokens

    def advance(
        self, top_log_probs: np.ndarray, top_ids: np.ndarray, eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """From each row's best candidates: ranks them over the rows as the step graph's search head does
        (runtime/contract.py's CANDIDATE_OUTPUTS), then ``advance_ranked``."""
        k = min(self.top_k, top_ids.shape[1])
        values = (np.asarray(self.scores)[:, None] + top_log_probs[:, :k]).reshape(-1)  # float64, as the scores
        # Best first, ties to the lower row, then the lower token: each row's candidates come best first with
        # ties to the lower token (ONNX TopK's order), so a stable sort of the rows in order keeps both.
        ranked = np.argsort(-values, kind="stable")[: 2 * self.beam]
        candidates = values[ranked], ranked // k, top_ids[:, :k].reshape(-1)[ranked]
        return self.advance_ranked(*(c.tolist() for c in candidates), eos_log_probs)

    def advance_ranked(
        self, values: Sequence[float], origins: Sequence[int], tokens: Sequence[int], eos_log_probs: np.ndarray
    ) -> tuple[Sequence[int], Sequence[int]]:
        """This step's best extensions over the live rows, best first (at least 2·beam: their scores, rows
        and tokens), and each row's eos log-probability -> (origin of each next row, its token); none when
        done. The 2·beam best are all a step needs: at most one per row ends in eos."""
        rows, length, beam = len(self.scores), len(self.steps) + 1, self.beam
        at_limit = length >= self.max_length
        if at_limit:  # the only way on is to end
            ends = np.asarray(self.scores) + eos_log_probs.reshape(rows)
            ranked = np.argsort(-ends, kind="stable")[: 2 * beam]
            values, origins, tokens = ends[ranked].tolist(), ranked.tolist(), [self.eos_id] * len(ranked)
        elif self.eos_id not in tokens[:beam] and not self._may_stop(origins[:beam], tokens[:beam]):
            # The usual step: the best beam extensions go on, and nothing finishes.
            return self._go_on(origins[:beam], tokens[:beam], values[:beam])
        kept_origins, kept_tokens, kept_scores = [], [], []
        ranked_candidates = zip(origins[: 2 * beam], tokens[: 2 * beam], values[: 2 * beam], strict=True)
        for rank, (origin, token, value) in enumerate(ranked_candidates):
            if token == self.eos_id:
                if rank < beam:
                    stopped = "length" if at_limit else "eos"
                    hypothesis = Hypothesis(self.output(origin), value / length, stopped)
                    self.finished.append((length_normalized(value, length, self.alpha), hypothesis))
            elif self.stop_rules and (stop := self._stopped(origin, token)) is not None:
                # It ends here, cut back as the rule says (the runaway guard: to the repeated n-gram's first
                # occurrence); at any rank, so that a step whose candidates all stop still leaves a hypothesis.
                kept, reason = stop
                hypothesis = Hypothesis(kept, value / length, reason)
                self.finished.append((length_normalized(value, length, self.alpha), hypothesis))
            elif len(kept_origins) < beam:
                kept_origins.append(origin)
                kept_tokens.append(token)
                kept_scores.append(value)
            if len(self.finished) >= beam or (len(kept_origins) == beam and rank >= beam - 1):
                break
        if len(self.finished) >= beam or at_limit or not kept_origins:
            self.rows = 0
            return _NO_ROWS, _NO_ROWS
        return self._go_on(kept_origins, kept_tokens, kept_scores)

    def _go_on(
        self, origins: Sequence[int], tokens: Sequence[int], scores: Sequence[float]
    ) -> tuple[list[int], list[int]]:
        """The next rows: these extensions (rank order), placed by ``in_place_order``."""
        order = in_place_order(origins)
        origins, tokens = [origins[i] for i in order], [tokens[i] for i in order]
        self.scores = [scores[i] for i in order]
        if self.stop_rules:
            self.tails = [(*self.tails[o], t)[-self.window :] for o, t in zip(origins, tokens, strict=True)]
        self.steps.append((origins, tokens))
        self.rows = len(origins)
        return origins, tokens

    def _may_stop(self, origins: Sequence[int], tokens: Sequence[int]) -> bool:
        """Whether a stop rule must look closer at these extensions (``StopRule.may_stop`` on its row's tail)."""
        return any(
            rule.may_stop(self.tails[origin], token)
            for rule in self.stop_rules
            for origin, token in zip(origins, tokens, strict=True)
        )

    def _stopped(self, origin: int, token: int) -> tuple[list[int], str] | None:
        """The row's tokens and this one cut back as the first stop rule that ends them says, and its reason; None
        when none does. A rule looks closer only where its ``may_stop`` says it may end them."""
        output = None
        for rule in self.stop_rules:
            if rule.may_stop(self.tails[origin], token):
                output = output or [*self.output(origin), token]
                if (drop := rule.ends(output)) is not None:
                    return output[: len(output) - drop], rule.reason
        return None

    def result(self) -> Hypothesis:
        """The best finished hypothesis (the first of equals), the others as its alternatives."""
        best, *others = (hypothesis for _, hypothesis in sorted(self.finished, key=lambda f: -f[0]))  # stable
        distinct = {tuple(best.tokens): best}
        for hypothesis in others:  # the better of two equal outputs (the guard may cut two rows alike)
            distinct.setdefault(tuple(hypothesis.tokens), hypothesis)
        return best._replace(alternatives=tuple(distinct.values())[1:])


def in_place_order(origins: Sequence[int]) -> list[int]:
    """An order for the next rows (given their origins in rank order) in which each origin's first child
    takes the origin's own row, the others the rows left, in rank order: a row that stays in place is not
    copied in the cache (KVCache.select), and in rank order two in three would move (beam 4,
    test_2016_flickr: 43,299 row moves against 19,837)."""
    slots: list[int | None] = [None] * len(origins)
    others = []
    for index, origin in enumerate(origins):
        if origin < len(slots) and slots[origin] is None:
            slots[origin] = index
        else:
            others.append(index)
    rest = iter(others)
    return [next(rest) if slot is None else slot for slot in slots]


@dataclass(frozen=True)
class Decoding:
    """How a batch's searches are made: the model's eos, beam search's length penalty (α) and the stop rules."""

    eos_id: int
    alpha: float = LENGTH_PENALTY
    stop_rules: StopRules = ()

    def search(self, beam: int, max_length: int) -> Search:
        """A search of ``beam`` rows (1: greedy) for at most ``max_length`` tokens, eos included."""
        if beam == 1:
            return GreedySearch(max_length, self.eos_id, self.stop_rules)
        return BeamSearch(beam, max_length, self.eos_id, self.alpha, self.stop_rules)
