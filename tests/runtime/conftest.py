"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.device_cache import CacheOps
from runtime.providers import PROVIDERS


@pytest.fixture(scope="module")
def cache_ops(provider: str) -> CacheOps:
    """The one-node graphs that move float32 cache rows, on the provider of the device-path tests (a provider's
    device has its name)."""
    return CacheOps(PROVIDERS[provider], provider, np.float32)
