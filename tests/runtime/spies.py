"""What the runtime tests wrap a session's calls in, to count them."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any


def counted(counts: MutableMapping[str, int], name: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run``, counting its calls in counts[name]."""

    def counting(*args):
        counts[name] += 1
        return run(*args)

    return counting
