"""The GPU check in its smallest form, on the CPU provider: every part of the report runs (agreement, BLEU,
the CUDA-graph probe's reason, the server under load, the speed table), so the check a lent GPU runs cannot
rot between GPUs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def test_the_gpu_check_runs_on_the_cpu_provider(tiny_export: Path, multi30k: Path, tmp_path: Path):
    report = tmp_path / "gpu_check.md"
    flags = ["--model", str(tiny_export), "--provider", "cpu", "--data", str(multi30k), "--smoke"]
    assert gpu_check.main([*flags, "--report", str(report)]) == 0
    text = report.read_text()
    assert "provider cpu; 8 test_2016_flickr sentences" in text
    # The CPU provider agrees with itself exactly: a CUDA run that disagrees shows up as less than 100%.
    for beam in (1, 4):
        assert f"| cpu fp32 against CPU fp32, beam {beam}: identical outputs | 100.0% |" in text
        assert f"| cpu fp16 against CPU fp16, beam {beam}: identical outputs | 100.0% |" in text
        assert f"| cpu fp16, cache on host against CPU fp16, beam {beam}: identical outputs | 100.0% |" in text
    # Node by node, the provider against itself: nothing differs, and the step bound in place agrees exactly.
    for variant in ("fp32", "fp16"):
        for part in ("encoder", "decoder"):
            assert re.search(
                rf"\| cpu {variant} {part} against CPU, node by node: 0 of \d+ outputs differ \| none \|", text
            )
        assert re.search(rf"\| cpu {variant} decoder step bound in place .*\| top_log_probs 0, top_ids 0,", text)
    assert re.search(r"\| cpu fp16: BLEU, greedy \| \d+\.\d\d \|", text)
    assert "| CUDA graphs (decoder step, fp16) | not run: CUDA graphs need the CUDA provider |" in text
    first = r"\nServer under load: 2 closed-loop clients, 1 sentences a request, fp32, .* errors (\d+)"
    served = re.search(first, text)
    assert served and served.group(1) == "0", text
    for case in ("batch 1, greedy", "batch 1, beam 4", "batch 4, greedy", "batch 4, beam 4"):
        row = re.search(rf"\| {case} \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|", text)
        assert row and all(int(cell.replace(",", "")) > 0 for cell in row.groups()), text


def test_the_gpu_check_says_when_the_provider_is_missing(tiny_export: Path, capsys):
    if "CUDAExecutionProvider" in gpu_check.ort.get_available_providers():
        return  # a CUDA build: nothing missing to report
    assert gpu_check.main(["--model", str(tiny_export)]) == 2
    assert "has no cuda provider (make gpu-check installs onnxruntime-gpu)" in capsys.readouterr().out


def test_a_server_that_cannot_start_is_a_finding_not_the_end_of_the_report(tiny_export: Path, monkeypatch):
    from testkit import servers

    def no_server(*args, **kwargs):
        raise AssertionError("server did not start")

    monkeypatch.setattr(servers, "start_subprocess_server", no_server)
    served = gpu_check.serve_under_load(tiny_export, "cpu", "fp32", Path("unused"), 1.0, 1)
    assert served == "not run: server did not start"


def test_node_differences_name_the_node_and_its_operator():
    expected = {"a": np.array([1.0, 2.0]), "b": np.array([0.0, -np.inf]), "c": np.ones((2, 2)), "d": np.ones(3)}
    ops = {"a": "MatMul", "b": "Add", "c": "Gather", "d": "Softmax"}
    assert gpu_check.differences(dict(expected), expected, ops, 1e-3) == []
    got = {"a": np.array([1.0, 2.1]), "b": np.array([0.0, 5.0]), "c": np.ones((2, 3)), "d": np.ones(3) + 1e-5}
    assert gpu_check.differences(got, expected, ops, 1e-3) == [
        "a (MatMul): relative 0.05",
        "b (Add): infinities differ",
        "c (Gather): shape (2, 3) against (2, 2)",
    ]


def test_every_node_output_becomes_a_graph_output(tiny_export: Path):
    import onnx

    path = tiny_export / "encoder.onnx"
    graph = onnx.load(str(path)).graph
    outputs = {name for node in graph.node for name in node.output if name}
    graph_bytes, ops = gpu_check.every_output(path)
    exposed = onnx.load_from_string(graph_bytes).graph.output
    assert outputs <= {o.name for o in exposed}
    assert all(ops[name] == node.op_type for node in graph.node for name in node.output if name)


def test_the_step_profile_times_a_full_bucket_on_the_cpu_provider(tiny_export: Path, capsys):
    """The profile a lent GPU runs under Nsight Compute (benchmarks/gpu_device.sh profile), in its CPU form: the
    batch keeps every row decoding for every timed step."""
    import gpu_step_profile

    for flags in (["--rows", "2", "--beam", "2"], ["--rows", "3", "--steps-per-run", "2", "--graphs", "--fusions"]):
        args = ["--model", str(tiny_export), "--provider", "cpu", "--variant", "fp32", "--warmup", "2", "--steps", "3"]
        assert gpu_step_profile.main(args + flags) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "2 sources x beam 2 (4 rows), 1 steps per run" in lines[0]
    assert "3 sources x beam 1 (3 rows), 2 steps per run, graphs True, fusions True" in lines[1]
    assert all(re.search(r"\d+\.\d{3} ms per step$", line) for line in lines)


def test_the_step_anatomy_counts_a_steps_runs_copies_and_nodes_on_the_cpu_provider(
    tiny_export: Path, multi30k: Path, tmp_path: Path, capsys
):
    """The anatomy a lent GPU runs (benchmarks/gpu_device.sh anatomy), in its CPU form: each engine's step splits
    into its runs and the host's share, the spy counts the copies the same path makes on a device (a greedy step in
    buckets copies its tokens and lengths up and reads two outputs back; beam search also reorders its caches in a
    second run), and the node count is that of the graph ONNX Runtime writes out after optimizing it."""
    import json

    import step_anatomy

    out = tmp_path / "anatomy.json"
    flags = ["--model", str(tiny_export), "--provider", "cpu", "--variant", "fp32", "--repeats", "1", "--warmup", "2"]
    engines = ["--engines", "host,compact,captured,captured-k8", "--sizes", "1,2x2", "--max-length", "20"]
    drain = ["--drain", str(multi30k), "--drain-sentences", "8", "--drain-sizes", "4"]
    assert step_anatomy.main([*flags, *engines, *drain, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    steps = {(r["engine"], r["sources"], r["beam"]): r for r in results if "step_ms" in r}
    assert len(steps) == 8
    for result in steps.values():
        assert result["step_ms"] > result["run_ms"] > 0
        assert abs(result["host_ms"] - (result["step_ms"] - result["run_ms"])) < 1e-9
        assert sum(result["nodes"].values()) > 20
        assert result["stubbed_ms"] > 0
    for engine in ("host", "compact", "captured"):  # with its runs replayed, a greedy step costs less than one run
        assert steps[(engine, 1, 1)]["stubbed_ms"] < steps[(engine, 1, 1)]["run_ms"]
    host = steps[("host", 1, 1)]  # the CPU's serving path: greedy rows on their own graph, numpy in and out
    assert (host["runs"], host["up"], host["down"]) == (1, 0, 0) and sum(host["nodes"].values()) < sum(
        steps[("compact", 1, 1)]["nodes"].values()
    )
    greedy, beam = steps[("captured", 1, 1)], steps[("captured", 2, 2)]
    # the device greedy step: its state written on the device, one packed output read back
    assert (greedy["runs"], greedy["up"], greedy["down"]) == (1, 0, 1)
    assert sum(greedy["nodes"].values()) < sum(steps[("captured", 2, 2)]["nodes"].values())
    assert beam["rows"] == 4 and beam["runs"] > 1 and beam["down"] > greedy["down"]
    chunked = steps[("captured-k8", 1, 1)]
    assert chunked["steps_per_run"] == 8 and (chunked["runs"], chunked["up"]) == (1, 2)
    assert steps[("compact", 1, 1)]["up"] == 0  # on the CPU the compact step binds the host's arrays themselves
    drains = [r for r in results if "drain" in r]
    assert [r["engine"] for r in drains] == ["host", "compact", "captured", "captured-k8"]
    assert all(r["tokens_per_s"] > 0 and len(r["own_time"]) == step_anatomy.DRAIN_TOP for r in drains)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| captured |")]
    assert len(table) == 2 and table[0].endswith("| - | - | - | - |")  # no kernels without a GPU
