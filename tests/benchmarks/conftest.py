"""Benchmarks are scripts, not a package: their tests load them from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from common.corpus import MULTI30K
from server.config import DEFAULT_MODELS

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (registered under its name: its dataclasses look themselves up there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def need_corpus_and_models() -> None:
    """Skip, saying why, where the Multi30k corpus or the exported default models a flood sends from are missing."""
    if not (MULTI30K / "train.en.gz").exists() or not (MULTI30K / "test_2016_flickr.en.gz").exists():
        pytest.skip(f"Multi30k corpus not found at {MULTI30K} (common/corpus.py's MULTI30K: place it there)")
    if not all((model / "manifest.json").exists() for model in DEFAULT_MODELS):
        pytest.skip("the default models are not exported (make export)")
