"""The engine plan: every choice the backend acts on resolved once, in one frozen value, and an impossible
combination refused with one message naming all of it; the backend's constructor only loads and follows it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from runtime.backend import OrtBackend
from runtime.options import EngineSettings, RuntimeOptions
from tests.conftest import ROOT


def test_the_plan_follows_the_settings_and_the_loaded_step(tiny_export: Path):
    settings = EngineSettings(provider="cpu", variant="fp32", batch_layout="buckets")
    engine = OrtBackend(tiny_export, RuntimeOptions(settings=settings, io_binding=True, cuda_graphs=True))
    plan = engine.plan
    assert (plan.provider, plan.variant, plan.device, plan.batch_layout) == ("cpu", "fp32", "cpu", "buckets")
    assert plan.io_binding and plan.device_buckets and plan.cuda_graphs and not plan.device_cache
    assert plan.d_cache % 8 == 0 and engine.d_cache == plan.d_cache and engine.io_binding
    assert engine.device_steps is not None and engine.k_steps is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.steps_per_run = 2  # type: ignore[misc]
    compact = OrtBackend(tiny_export, RuntimeOptions(settings=EngineSettings(provider="cpu", variant="fp32")))
    assert not compact.plan.io_binding and not compact.plan.device_buckets and not compact.plan.cuda_graphs


def test_what_only_the_loaded_engine_can_tell_is_refused_when_it_is_planned(tiny_export: Path):
    """RuntimeOptions refuses what the settings alone show; the plan, what needs the provider and the step: a
    capture without buffers on a device, several steps per run on a device in the compact layout."""
    buckets = EngineSettings(provider="cpu", variant="fp32", batch_layout="buckets")
    with pytest.raises(ValueError, match="cuda_graphs captures each bucket's step: it needs batch_layout buckets on"):
        OrtBackend(tiny_export, RuntimeOptions(settings=buckets, io_binding=False, cuda_graphs=True))
    compact = EngineSettings(provider="cpu", variant="fp32")
    with pytest.raises(ValueError, match="steps_per_run > 1 on a device runs in batch_layout buckets only"):
        OrtBackend(tiny_export, RuntimeOptions(settings=compact, device_cache=True, steps_per_run=2))


def test_the_backends_constructor_only_loads_and_follows_the_plan():
    tree = ast.parse((ROOT / "runtime" / "backend.py").read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert init.end_lineno - init.lineno + 1 < 25
