"""Decoding with sources arriving: the one loop the engine's tests drive a running batch with (sources join at
the steps they arrive at, some leave before they are done, the batch steps until every one has an answer)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.search import Hypothesis


@dataclass
class Decoded:
    results: dict[Hashable, Hypothesis]  # each finished source's hypothesis, by key
    steps: int  # the batch's steps (runs of its step function)

    def tokens(self, keys: Sequence[Hashable]) -> list[list[int]]:
        """The outputs of ``keys``, in their order."""
        return [self.results[key].tokens for key in keys]


def decode_arriving(
    batch: Any,
    arrivals: Mapping[int, Sequence[tuple[Hashable, int]]],
    encode: Callable[[list[Hashable]], Any],
    limit: Callable[[Hashable], int],
    *,
    removed: Mapping[int, Hashable] | None = None,
    joined: Callable[[Any], None] | None = None,
    stepped: Callable[[Any], None] | None = None,
) -> Decoded:
    """Step ``batch`` until it is empty and every arrival has joined: before step s the sources
    ``arrivals[s]`` ((key, beam) pairs) join, encoded together by ``encode(keys)``, each with ``limit(key)`` as
    its longest output, and ``removed[s]`` leaves; ``joined(batch)`` and ``stepped(batch)`` check the batch
    after each join and each step."""
    results: dict[Hashable, Hypothesis] = {}
    step = steps = 0
    while len(batch) or step <= max(arrivals):
        if step in arrivals:
            keys = [key for key, _ in arrivals[step]]
            batch.add(keys, encode(keys), [beam for _, beam in arrivals[step]], [limit(key) for key in keys])
            if joined is not None:
                joined(batch)
        if removed and step in removed:
            batch.remove(removed[step])
        if len(batch):
            results.update(batch.step())
            steps += 1
            if stepped is not None:
                stepped(batch)
        step += 1
    return Decoded(results, steps)


def full_step_batch(engine: Any) -> Any:
    """A new batch of ``engine`` (an ``OrtBackend``) whose greedy sources step on the full step graph, search head
    and all, as beam search's do, rather than on greedy batches' own graph: what the greedy graph is checked
    against."""
    batch = engine.new_batch()
    batch.k_steps_fn = None
    return batch
