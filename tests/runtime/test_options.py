"""The engine's settings and options: keyword-only values, checked when built."""

from __future__ import annotations

import pytest

from runtime.options import EngineSettings, RuntimeOptions, flat_options


def test_settings_are_keyword_only():
    with pytest.raises(TypeError):
        EngineSettings("fp32", "cpu", 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        RuntimeOptions(EngineSettings())  # type: ignore[misc]


def test_the_options_hold_the_settings_unchanged():
    settings = EngineSettings(variant="int8", provider="cpu", batch_layout="buckets", intra_op_threads=3)
    options = RuntimeOptions(settings=settings, spinning=False)
    assert options.settings is settings and not options.spinning
    assert RuntimeOptions().settings == EngineSettings()


def test_every_wrong_setting_is_named_in_one_error():
    with pytest.raises(ValueError) as error:
        EngineSettings(variant="fp64", batch_layout=1, intra_op_threads=-1)  # type: ignore[arg-type]
    message = str(error.value)
    assert "variant='fp64': use" in message and "batch_layout=1: use compact or buckets" in message
    assert "intra_op_threads=-1: use 0 (one per usable core) or more" in message


@pytest.mark.parametrize("threads", [True, 1.0, "2"])
def test_a_thread_count_of_another_type_is_refused(threads):
    with pytest.raises(ValueError, match=r"intra_op_threads=.*: use an int"):
        EngineSettings(intra_op_threads=threads)  # type: ignore[arg-type]


def test_impossible_option_combinations_are_named_together():
    with pytest.raises(ValueError) as error:
        RuntimeOptions(device_cache=True, io_binding=False, cuda_graphs=True, steps_per_run=0, spinning="yes")
    message = str(error.value)
    for problem in (
        "spinning='yes': use a bool",
        "steps_per_run=0: use 1 or more",
        "device_cache=True keeps the cache on the step's device, which needs io_binding",
        "cuda_graphs=True captures each bucket's step: it needs batch_layout 'buckets'",
    ):
        assert problem in message


def test_flat_options_put_each_name_where_it_belongs():
    options = flat_options(provider="cpu", batch_layout="buckets", steps_per_run=2)
    assert options.settings == EngineSettings(provider="cpu", batch_layout="buckets") and options.steps_per_run == 2
    with pytest.raises(TypeError):
        flat_options(threads=2)
