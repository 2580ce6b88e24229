"""Server configuration: flags over TRANSLATE_* variables over defaults, flat names for the nested engine and
scheduler settings, errors that name the setting, and the lanes' thread plan it makes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import flags
from runtime.cpu import usable_cores
from runtime.options import EngineSettings
from server.config import DEFAULT_MODELS, SchedulerSettings, ServerConfig, parse_config
from server.scheduling.threads import ThreadPlan, plan_threads


def plan(**settings):
    """The thread plan of the default config with ``settings`` by their flag names."""
    return plan_threads(flags.replace(ServerConfig(), **settings))


def test_flags_win_over_the_environment_which_wins_over_defaults():
    environ = {"TRANSLATE_MAX_BATCH_SIZE": "16", "TRANSLATE_SCHEDULER": "continuous", "TRANSLATE_WARMUP": "false"}
    config = parse_config(["--max-batch-size", "8", "--lanes", "32,128"], environ)
    assert config.scheduling.max_batch_size == 8 and config.scheduling.scheduler == "continuous"
    assert config.warmup is False and config.scheduling.lanes == (32, 128)
    assert parse_config([], {}).scheduling.lanes == ServerConfig().scheduling.lanes == (64,)
    assert parse_config(["--lanes", ""], {}).scheduling.lanes == ()
    assert parse_config([], {"TRANSLATE_LANES": "16, 256"}).scheduling.lanes == (16, 256)


def test_the_engine_and_scheduler_settings_nest_under_flat_flag_and_variable_names():
    environ = {"TRANSLATE_VARIANT": "int8", "TRANSLATE_INTRA_OP_THREADS": "2", "TRANSLATE_MAX_QUEUE_SIZE": "9"}
    config = parse_config(["--provider", "cpu", "--lane-replicas", "3", "--max-batch-delay-ms", "1"], environ)
    assert config.engine == EngineSettings(variant="int8", provider="cpu", intra_op_threads=2)
    assert config.scheduling == SchedulerSettings(max_queue_size=9, lane_replicas=3, max_batch_delay_ms=1.0)
    assert flags.replace(ServerConfig(), provider="cpu", max_batch_size=8, port=1) == ServerConfig(
        engine=EngineSettings(variant="auto", provider="cpu"), scheduling=SchedulerSettings(max_batch_size=8), port=1
    )


def test_the_server_decodes_with_the_variant_its_provider_runs_best_and_beam_4_by_default():
    """Chosen by measurement (server/config.py, DEFAULT_BEAM); translate-file keeps fp32 and greedy."""
    assert ServerConfig().engine.variant == "auto" and ServerConfig().default_beam_size == 4
    assert EngineSettings().variant == "fp32"
    assert parse_config(["--variant", "fp32", "--default-beam-size", "1"], {}).engine.variant == "fp32"


def test_onnx_runtime_threads_do_not_spin_by_default():
    assert ServerConfig().intra_op_spinning is False
    assert parse_config(["--intra-op-spinning", "true"], {}).intra_op_spinning is True


def test_the_thread_plan_gives_each_core_a_running_batch_of_each_lane_size_on_one_session_thread():
    cores = usable_cores()
    assert plan() == ThreadPlan(session_threads=1, cpu_replicas=cores, cuda_replicas=1)
    assert plan(intra_op_threads=2) == ThreadPlan(1, 2, 1)  # the Kubernetes ConfigMap's setting: 2 cores
    assert plan(lane_replicas=1, intra_op_threads=4) == ThreadPlan(4, 1, 1)  # one batch on every thread
    assert plan(lane_replicas=2, intra_op_threads=8) == ThreadPlan(4, 2, 2)
    assert plan(lane_replicas=4, intra_op_threads=2) == ThreadPlan(1, 4, 4)  # never under one thread
    assert plan(scheduler="static", intra_op_threads=0) == ThreadPlan(0, 1, 1)  # one batch on ORT's threads
    assert plan(provider="cuda").replicas("cuda") == 1 and plan().replicas("cpu") == cores


def test_usable_cores_follow_the_containers_cpu_limit(tmp_path: Path):
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    for quota, cores in (("max 100000", affinity), ("100000 100000", 1), ("150000 100000", min(2, affinity))):
        cpu_max.write_text(quota + "\n")
        assert usable_cores(cpu_max) == cores
    assert usable_cores(tmp_path / "absent") == affinity  # no cgroup v2: the affinity alone


def test_one_lane_when_no_bounds_are_given():
    assert SchedulerSettings(lanes=()).lanes == ()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("scheduler", "fifo", "scheduler='fifo': use continuous or static"),
        ("lanes", (128, 64), "lanes=128,64: bounds must be positive and increasing"),
        ("max_batch_size", 0, "max_batch_size=0 must be at least 1"),
        ("lane_niceness", 20, "lane_niceness=20 must be within 0..19"),
        ("long_lane_share", 1.0, "long_lane_share=1.0 must be within 0..1"),
        ("lane_replicas", -1, "lane_replicas=-1 must be 0 (one per core) or more"),
    ],
)
def test_invalid_scheduler_settings_are_refused_by_name(field: str, value, message: str):
    with pytest.raises(ValueError, match="invalid scheduler settings") as error:
        flags.replace(ServerConfig(), **{field: value})
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_limit", 0, "batch_limit=0 must be -1 (no limit) or at least 1"),
        ("char_limit", -2, "char_limit=-2 must be -1 (no limit) or at least 1"),
        ("cache_mib", -1, "cache_mib=-1 must be 0 (no cache) or more"),
    ],
)
def test_invalid_server_settings_are_refused_by_name(field: str, value, message: str):
    with pytest.raises(ValueError, match="invalid server configuration") as error:
        flags.replace(ServerConfig(), **{field: value})
    assert message in str(error.value)


def test_an_invalid_engine_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="invalid engine settings: provider='tpu': use auto, cpu or cuda"):
        flags.replace(ServerConfig(), provider="tpu")


def test_an_invalid_nested_setting_is_a_usage_error_under_its_flag_name(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--max-batch-size", "0"], {"TRANSLATE_PROVIDER": "tpu"})
    error = capsys.readouterr().err
    assert "max_batch_size=0 must be at least 1" in error and "TRANSLATE_PROVIDER: 'tpu': use " in error


def test_invalid_flag_exits_with_usage(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--lanes", "64;128", "--port", "x"], {})
    error = capsys.readouterr().err
    assert "--lanes: '64;128': use comma-separated integers" in error and "--port: 'x' is not an integer" in error


def test_models_are_a_repeated_flag_or_a_comma_separated_variable():
    assert ServerConfig().model == tuple(DEFAULT_MODELS)
    assert parse_config(["--model", "a", "--model", "b"], {}).model == (Path("a"), Path("b"))
    environ = {"TRANSLATE_MODEL": "/m/en-de, /m/de-en"}
    assert parse_config([], environ).model == (Path("/m/en-de"), Path("/m/de-en"))
    assert parse_config(["--model", "c"], environ).model == (Path("c"),)  # the flag replaces the list
    assert ServerConfig(model=Path("one")).model == (Path("one"),)


@pytest.mark.parametrize(("model", "message"), [((), "give at least one"), ((Path("a"), Path("a")), "given twice")])
def test_a_model_list_that_cannot_be_served_is_refused(model, message: str):
    with pytest.raises(ValueError, match=message):
        ServerConfig(model=model)


@pytest.mark.parametrize(("threads", "replicas", "per_session"), [(2, 1, 2), (2, 2, 1), (4, 2, 2)])
def test_the_thread_count_reaches_every_session_of_the_server(
    tiny_export: Path, threads: int, replicas: int, per_session: int
):
    from server.app import serving_engines

    config = parse_config(
        ["--model", str(tiny_export), "--provider", "cpu", "--intra-op-threads", str(threads)]
        + ["--lane-replicas", str(replicas)]
    )
    (engine,) = serving_engines(config)
    backend = engine.backend
    sessions = (backend.encoder, backend.decoder, backend.small_encoder, backend.small_decoder)
    assert [session.get_session_options().intra_op_num_threads for session in sessions] == [per_session] * 4
