"""What a decoding sentence holds (runtime/memory.py's ``MemoryModel``): caches counted by the page per layer and
head, beam search's reorder temporary, an encoder call's scores growing with the square of its longest source;
and the process settings that make resident memory follow what the engine holds, with glibc and without it."""

from __future__ import annotations

import ctypes

import pytest

from runtime import memory
from runtime.memory import PAGE, MemoryModel, bound_process_memory, release_free_memory
from runtime.model_config import ModelConfig

try:
    from numpy._core import multiarray
except ImportError:  # numpy < 2
    from numpy.core import multiarray

CONFIG = ModelConfig(vocab_size=8000, d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024)
BLOCKS = 2 * CONFIG.n_decoder_layers * CONFIG.n_heads  # (layer, head) blocks of keys and values


@pytest.fixture
def model() -> MemoryModel:
    """float32 caches with a head size of 64: 16 slots fill a page."""
    return MemoryModel(CONFIG, itemsize=4, d_cache=64)


def test_caches_count_by_the_page_per_layer_and_head(model: MemoryModel):
    assert model.source_bytes(1) == model.source_bytes(15) == BLOCKS * PAGE  # eos included: 16 rows of d_head
    assert model.source_bytes(16) == BLOCKS * 2 * PAGE
    assert model.target_bytes(1, beam=1) == model.target_bytes(16, beam=1) == BLOCKS * PAGE
    assert model.target_bytes(17, beam=4) == 4 * model.target_bytes(17, beam=1) == 4 * BLOCKS * 2 * PAGE
    half = MemoryModel(CONFIG, itemsize=2, d_cache=64)  # fp16: twice the slots in a page
    assert half.target_bytes(32, beam=1) == model.target_bytes(16, beam=1)


def test_a_sequence_holds_its_caches_and_its_steps_working_memory(model: MemoryModel):
    def step(source: int, target: int, beam: int) -> int:
        """What is left when the caches are taken out: the decoder step's working memory."""
        caches = model.source_bytes(source) + model.target_bytes(target, beam)
        return model.sequence_bytes(source, target, beam) - caches

    greedy = step(10, 20, beam=1)
    assert greedy == step(100, 200, beam=1) > 3 * CONFIG.vocab_size * 4  # the logits' copies, whatever the lengths
    # Beam search's rows reorder through a temporary of one layer's keys or values.
    reorder = model.target_bytes(20, beam=4) // (2 * CONFIG.n_decoder_layers)
    assert step(10, 20, beam=4) == 4 * greedy + reorder


def test_an_encoder_calls_scores_grow_with_the_square_of_its_longest_source(model: MemoryModel):
    assert model.encoder_scores_bytes(8, 30) == 8 * model.encoder_scores_bytes(1, 30)
    at = [model.encoder_scores_bytes(1, longest) for longest in (99, 100, 101)]
    assert at[2] - 2 * at[1] + at[0] == 2 * memory.SCORE_COPIES * CONFIG.n_heads * 4  # B · H · S² float32 scores


class Libc:
    """glibc's malloc settings as calls to record."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def hugepages():
    """numpy's transparent huge pages on, and as they were after the test."""
    before = multiarray._set_madvise_hugepage(True)
    yield
    multiarray._set_madvise_hugepage(before)


@pytest.mark.usefixtures("hugepages")
def test_bound_process_memory_turns_off_huge_pages_and_sets_mallocs_thresholds_and_arenas(monkeypatch):
    calls = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc(calls))
    monkeypatch.setattr(memory, "usable_cores", lambda: 3)
    bound_process_memory()
    assert multiarray._set_madvise_hugepage(False) is False  # it was off already
    assert calls == [
        ("mallopt", memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD),
        ("mallopt", memory.M_TRIM_THRESHOLD, memory.TRIM_THRESHOLD),
        ("mallopt", memory.M_ARENA_MAX, 3 * memory.ARENAS_PER_CORE),
    ]
    calls.clear()
    monkeypatch.setattr(memory, "usable_cores", lambda: 1)
    bound_process_memory()
    assert calls[-1] == ("mallopt", memory.M_ARENA_MAX, 2)  # never fewer than two heaps
    release_free_memory()
    assert calls[-1] == ("malloc_trim", 0)


@pytest.mark.usefixtures("hugepages")
def test_without_glibc_the_settings_do_what_they_can(monkeypatch):
    def no_glibc(name: str):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_glibc)
    bound_process_memory()  # no error
    release_free_memory()
    assert multiarray._set_madvise_hugepage(False) is False  # numpy's part is done all the same
