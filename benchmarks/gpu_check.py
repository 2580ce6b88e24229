"""The engine on a GPU, checked and timed in one report: ``make gpu-check`` on a machine with one (it installs
onnxruntime-gpu, exports the default model with fp16 and converts it for CTranslate2), or
``python benchmarks/gpu_check.py --model DIR [--ct2 DIR] [--report PATH]``; ``--provider cpu --smoke`` is its
smallest form, which the suite runs on the CPU provider so that the check cannot rot.

1. Agreement: the provider's fp32 translations against the CPU provider's on test_2016_flickr (the share of
   identical outputs, greedy and beam 4), and BLEU of each variant, greedy.
2. Speed: output tokens/s of ours (fp32 and fp16 with the cache on the device for the whole decode, and fp32 with
   the cache on the host, bound every step) and of CTranslate2 (float16 on the same device, when ``--ct2`` names
   its converted folder and it has the device) at batch 1, 32 and 128, greedy and beam 4; medians of
   ``--repeats``, engines alternating within each repeat.
3. CUDA graphs: whether ONNX Runtime captures the decoder step (``enable_cuda_graph``) at a fixed batch of 32
   greedy rows, and the step's time replayed against run normally; any error is the finding.
4. The server on the device under the load generator (closed loop, ``--clients``, one test sentence per
   request, ``--load-seconds``): requests/s, p50, p99 and errors.
5. Buckets on the device (runtime/slotted_rows.py, runtime/captured.py): the fp16 step over fixed device buffers,
   without and with one captured CUDA graph per bucket, and with k greedy steps per run (k = 2, 4, 8): the
   Memcpy nodes ONNX Runtime adds to each graph, agreement with CPU fp32 and BLEU, and output tokens/s beside
   the compact engine's at batch 1, 32 and 128.

Where the device has no fp32 export or no CPU time to spare, ``--reference FILE`` takes CPU fp32's outputs
made beforehand on another machine (``--write-reference FILE`` on it), and ``--variants fp16`` loads only fp16;
``--budget SECONDS`` skips what would start after that many seconds, saying so.

Every line of the report says what it measured; a part that cannot run says why instead of failing the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import sacrebleu
import sentencepiece
from onnx import TensorProto, helper

from common.corpus import MULTI30K, corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.batch import pad_sources
from runtime.binding import bind_step, run_in_place
from runtime.contract import CANDIDATE_OUTPUTS, STEP_OUTPUTS
from runtime.cpu import describe_cpu
from runtime.manifest import read_manifest
from runtime.options import EngineSettings, RuntimeOptions, flat_options
from runtime.providers import NO_FUSIONS, PROVIDERS
from runtime.search import Decoding, default_max_output
from runtime.tokenizer import Tokenizer

STARTED = time.perf_counter()

ROOT = Path(__file__).resolve().parents[1]
SMOKE = {"sentences": 8, "batches": (1, 4), "repeats": 1, "load_seconds": 2.0, "clients": 2}
BATCH_1_SENTENCES = 150  # batch 1 is a latency case: fewer sentences keep the check under ten minutes
CAPTURE_ROWS, CAPTURE_STEPS = 32, 50
Translate = Callable[[list[list[int]], int], list[list[int]]]


class Report(list):
    """The report's lines, printed and written as each is added, so that a check cut short by its time limit
    still leaves what it measured."""

    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path

    def append(self, line: str) -> None:
        super().append(line)
        print(line, flush=True)
        if self.path:
            self.path.write_text("\n".join(self) + "\n")

    def __iadd__(self, lines):  # noqa: ANN001 (list's own signature)
        for line in lines:
            self.append(line)
        return self


def gpu_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no GPU (nvidia-smi absent)"


def rate(translate: Translate, sources: list[list[int]], batch: int, beam: int) -> tuple[float, list[list[int]]]:
    """Output tokens per second (each output plus its eos) and the outputs, in batches of similar length."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    start = time.perf_counter()
    for first in range(0, len(order), batch):
        group = order[first : first + batch]
        for i, output in zip(group, translate([sources[i] for i in group], beam), strict=True):
            outputs[i] = output
    return sum(len(o) + 1 for o in outputs) / (time.perf_counter() - start), outputs


def ct2_translator(work: Path, device: str) -> tuple[Translate | None, str]:
    """CTranslate2 on the device (float16 on CUDA) over the same ids, its model converted from the same weights
    by export.against_ctranslate2 in ``work`` (made there if missing), or None and why not."""
    try:
        import ctranslate2

        from export.against_ctranslate2 import prepare
        from model.checkpoint import DEFAULT_CHECKPOINT
    except ImportError as error:
        return None, f"not run: {error} (make gpu-check installs it)"
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return None, f"not run: ctranslate2 {ctranslate2.__version__} sees no CUDA device"
    compute = "float16" if device == "cuda" else "float32"
    _, converted, to_piece, to_id = prepare(argparse.Namespace(base_sized=False, checkpoint=DEFAULT_CHECKPOINT), work)
    translator = ctranslate2.Translator(str(converted), device, compute_type=compute)

    def translate(batch_ids: list[list[int]], beam: int) -> list[list[int]]:
        pieces = [[to_piece(t) for t in row] + ["</s>"] for row in batch_ids]
        limit = max(default_max_output(len(row), 256) for row in batch_ids) - 1
        results = translator.translate_batch(
            pieces, beam_size=beam, max_batch_size=len(batch_ids), max_decoding_length=limit
        )
        return [[to_id(p) for p in r.hypotheses[0]] for r in results]

    try:  # CTranslate2 loads its CUDA libraries on the first translation (its wheels need CUDA 12's cuBLAS)
        translate([[4, 5, 6]], 1)
    except RuntimeError as error:
        return None, f"not run: ctranslate2 {ctranslate2.__version__} on {device}: {str(error).splitlines()[0][:200]}"
    return translate, f"CT2 {compute}"


def every_output(path: Path) -> tuple[bytes, dict[str, str]]:
    """The graph at ``path`` with every node's outputs as graph outputs, so that two providers can be compared
    node by node (types from ONNX's shape inference; a contrib operator's, which it does not know, are taken to
    be its first input's), and the operator that makes each output."""
    model = onnx.load(str(path))
    graph = model.graph
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 (then every type comes from the node's first input)
        inferred = graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *graph.input, *graph.output]}
    types.update((t.name, t.data_type) for t in graph.initializer)
    known = {o.name for o in graph.output}
    for node in graph.node:
        for name in node.output:
            types.setdefault(name, types.get(node.input[0], TensorProto.FLOAT) if node.input else TensorProto.FLOAT)
            if name and name not in known:
                graph.output.append(helper.make_tensor_value_info(name, types[name], None))
                known.add(name)
    return model.SerializeToString(), {name: node.op_type for node in graph.node for name in node.output}


def differences(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], ops: dict[str, str], tolerance: float):
    """The outputs of ``got`` that differ from ``expected``'s, in ``expected``'s order, each with its operator:
    another shape, infinities elsewhere, or a largest difference over ``tolerance`` relative to the largest
    finite value expected."""
    differing = []
    for name, wanted in expected.items():
        value = got[name]
        if value.shape != wanted.shape:
            differing.append(f"{name} ({ops.get(name)}): shape {value.shape} against {wanted.shape}")
            continue
        a, b = np.asarray(value, np.float64), np.asarray(wanted, np.float64)
        finite = np.isfinite(b)
        if not np.array_equal(np.isfinite(a), finite):
            differing.append(f"{name} ({ops.get(name)}): infinities differ")
            continue
        scale = max(float(np.abs(b[finite]).max(initial=0.0)), 1e-6)
        error = float(np.abs(a[finite] - b[finite]).max(initial=0.0)) / scale
        if error > tolerance:
            differing.append(f"{name} ({ops.get(name)}): relative {error:.2g}")
    return differing


def divergence(model_dir: Path, variant: str, provider: str, sentences: list[str]) -> list[str]:
    """Each graph's every node output on ``provider`` against the CPU provider on the same feeds (the encoder
    over a few test sentences; the decoder step three steps into their beam-2 search, fed as the host decodes
    it): the nodes that differ by more than a relative tolerance, the first few named, in graph order."""
    host = OrtBackend(
        model_dir,
        RuntimeOptions(
            settings=EngineSettings(variant=variant, provider="cpu"),
            io_binding=False,
            device_cache=False,
            spinning=False,
        ),
    )
    c = host.config
    sources = host.tokenizer.encode_source(sentences[:4])
    src_tokens, src_mask = pad_sources(sources, c.pad_id, c.eos_id)
    batch = host.new_batch()
    limits = [default_max_output(len(source), 64) for source in sources]
    batch.add(list(range(len(sources))), host.encode_sources(sources), [2] * len(sources), limits)
    for _ in range(3):
        batch.step()
    files = host.manifest["variants"][variant]
    feeds = {
        "encoder": {"src_tokens": src_tokens, "src_mask": src_mask},
        "decoder": {name: np.array(value) for name, value in batch.step_inputs().feeds.items()},
    }
    tolerance = 1e-2 if variant == "fp16" else 1e-3
    lines = []
    for part in ("encoder", "decoder"):
        graph, ops = every_output(model_dir / files[part])
        runs = []
        for where in (PROVIDERS[provider], PROVIDERS["cpu"]):
            session = ort.InferenceSession(graph, providers=[where], disabled_optimizers=NO_FUSIONS)
            wanted = {i.name for i in session.get_inputs()}
            outputs = session.run(None, {k: v for k, v in feeds[part].items() if k in wanted})
            runs.append(dict(zip([o.name for o in session.get_outputs()], outputs, strict=True)))
        differing = differences(runs[0], runs[1], ops, tolerance)
        first = "; ".join(differing[:8]) if differing else "none"
        lines.append(
            f"| {provider} {variant} {part} against CPU, node by node: {len(differing)} of {len(runs[1])} "
            f"outputs differ | {first} |"
        )
    # The step as the engine binds it (each cache in place, on the provider's device): the largest absolute
    # difference of each output against the CPU provider's.
    path = str(model_dir / files["decoder"])
    got, expected = (
        run_in_place(ort.InferenceSession(path, providers=[PROVIDERS[where]]), feeds["decoder"])
        for where in (provider, "cpu")
    )
    largest = {
        name: np.abs(np.nan_to_num(got[name].astype(np.float64) - expected[name], posinf=0, neginf=0)).max(initial=0)
        for name in STEP_OUTPUTS + CANDIDATE_OUTPUTS
    }
    errors = [f"{name} {error:.2g}" for name, error in largest.items()]
    lines.append(
        f"| {provider} {variant} decoder step bound in place against CPU: largest difference | {', '.join(errors)} |"
    )
    return lines


def capture(model: OrtBackend, provider: str) -> str:
    """Whether ONNX Runtime captures the decoder step as a CUDA graph at CAPTURE_ROWS greedy rows, and the
    step's time replayed against run normally (or why not)."""
    if provider != "cuda":
        return "not run: CUDA graphs need the CUDA provider"
    c = model.config
    rng = np.random.default_rng(0)
    sources = [rng.integers(4, c.vocab_size, 20).tolist() for _ in range(CAPTURE_ROWS)]
    batch = model.new_batch(Decoding(eos_id=-1))
    limits = [2 * CAPTURE_STEPS + 10] * len(sources)
    batch.add(list(range(len(sources))), model.encode_sources(sources), [1] * len(sources), limits)
    batch.step()  # the feeds of a running decode (a fresh batch's total length is 0, which CUDA's kernel refuses)
    path = str(model.folder / model.manifest["variants"][model.variant]["decoder"])
    times = {}
    for graphs in (False, True):
        options = ort.SessionOptions()
        try:
            provider_options = {"enable_cuda_graph": "1"} if graphs else {}
            session = ort.InferenceSession(
                path, options, [(PROVIDERS["cuda"], provider_options)], disabled_optimizers=NO_FUSIONS
            )
            bound = bind_step(session, batch.step_inputs().feeds, model.device, feeds_on=model.device)
            for _ in range(3):  # ONNX Runtime captures after its warm-up runs
                session.run_with_iobinding(bound.binding)
            start = time.perf_counter()
            for _ in range(CAPTURE_STEPS):
                session.run_with_iobinding(bound.binding)
            times[graphs] = (time.perf_counter() - start) / CAPTURE_STEPS
        except Exception as error:  # noqa: BLE001 (the error is the finding)
            return f"not captured: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return (
        f"captured: {times[True] * 1e3:.3f} ms per step replayed against {times[False] * 1e3:.3f} ms run normally "
        f"({times[False] / times[True]:.2f}x), {CAPTURE_ROWS} greedy rows at fixed shapes"
    )


def serve_under_load(
    model_dir: Path,
    provider: str,
    variant: str,
    data: Path,
    seconds: float,
    clients: int,
    extra: tuple[str, ...] = (),
    sentences: int = 1,
) -> str:
    sys.path.insert(0, str(ROOT))  # testkit's server helpers (testkit/ is not installed)
    from client import loadtest, loadtest_report
    from testkit.servers import start_subprocess_server

    # Language detection is off: its model is not what this part measures, and one source language needs none.
    flags = ("--provider", provider, "--variant", variant, "--language-detection", "off", *extra)
    try:
        process, port, _ = start_subprocess_server(model_dir, *flags)
    except AssertionError as error:
        return f"not run: {error}"
    try:
        args = loadtest.bounded(port, 1_000_000, seconds)
        tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "sentencepiece.model"))
        source = corpus_path(data, "test_2016_flickr", "en")
        spec = f"file:{source}" if sentences == 1 else f"corpus:{source}:0:doc:{sentences}-{sentences}:0"
        profile = loadtest.Profile(spec, tokenizer)  # documents of ``sentences`` lines
        run = asyncio.run(loadtest.drive(args, profile, clients, 0.0))
    finally:
        process.terminate()
        process.wait(30)
    ok = [r.latency for r in run.results if r.code == "OK"]
    p50, p99 = (loadtest_report.percentile(ok, q) * 1e3 for q in (0.5, 0.99))
    return (
        f"{clients} closed-loop clients, {sentences} sentences a request, {' '.join((variant, *extra))}, "
        f"{run.seconds:.0f} s: {len(ok) / run.seconds:,.1f} requests/s, "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"errors {len(run.results) - len(ok)}"
    )


def memcpy_nodes(model: bytes | str, provider: str, provider_options: dict | None = None) -> int | str:
    """Memcpy nodes ONNX Runtime adds to a graph on ``provider`` (counted in the graph it saves after
    partitioning), or why not counted."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(work) / "optimized.onnx")
        chosen = [(PROVIDERS[provider], provider_options or {})]
        try:
            ort.InferenceSession(model, options, chosen, disabled_optimizers=NO_FUSIONS)
            saved = onnx.load(options.optimized_model_filepath, load_external_data=False)
        except Exception as error:  # noqa: BLE001 (the error is the finding)
            return f"not counted: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return sum(node.op_type.startswith("Memcpy") for node in saved.graph.node)


def memcpy_lines(model_dir: Path, variant: str, provider: str) -> list[str]:
    """The Memcpy count of the step as exported, after ``split_host_feeds``, and of the k-step graph."""
    from runtime.step_graphs import k_step_graph, split_host_feeds

    path = model_dir / read_manifest(model_dir, verify=False)["variants"][variant]["decoder"]
    graphs = {
        "decoder step as exported": onnx.load(str(path)),
        "decoder step, host feeds split (captured)": split_host_feeds(onnx.load(str(path))),
        "8 greedy steps per run, totals computed in the graph": k_step_graph(onnx.load(str(path)), 8),
        "8 greedy steps per run, totals from the host (captured)": k_step_graph(onnx.load(str(path)), 8, True),
    }
    return [
        f"| {provider} {variant} {name}: Memcpy nodes | {memcpy_nodes(graph.SerializeToString(), provider)} |"
        for name, graph in graphs.items()
    ]


BUCKET_ENGINES = {  # name: RuntimeOptions beyond the variant and provider
    "compact": {"device_cache": True},
    "buckets": {"batch_layout": "buckets", "io_binding": True},
    "buckets, graphs": {"batch_layout": "buckets", "io_binding": True, "cuda_graphs": True},
    **{
        f"buckets, graphs, k={k}": {
            "batch_layout": "buckets",
            "io_binding": True,
            "cuda_graphs": True,
            "steps_per_run": k,
        }
        for k in (2, 4, 8)
    },
    # ONNX Runtime's fusions, which every session turns off for the CPU's sake (runtime.providers.NO_FUSIONS)
    "buckets, graphs, k=8, fusions": {
        "batch_layout": "buckets",
        "io_binding": True,
        "steps_per_run": 8,
        "fusions": True,
    },
}


def bucket_engines(model_dir: Path, variant: str, provider: str) -> tuple[dict[str, OrtBackend], list[str]]:
    """BUCKET_ENGINES that load here (a CPU run has no graphs to capture, but runs the same code)."""
    from runtime import providers

    engines, lines = {}, []
    for name, extra in BUCKET_ENGINES.items():
        if provider == "cpu":
            extra = {key: value for key, value in extra.items() if key != "device_cache"}
        extra, fusions = dict(extra), extra.get("fusions", False)
        extra.pop("fusions", None)
        kept, providers.NO_FUSIONS = providers.NO_FUSIONS, [] if fusions else providers.NO_FUSIONS
        try:
            engines[name] = OrtBackend(model_dir, flat_options(variant=variant, provider=provider, **extra))
        except Exception as error:  # noqa: BLE001 (the error is the finding)
            lines.append(f"| {variant} {name} | not loaded: {type(error).__name__}: {str(error)[:300]} |")
        finally:
            providers.NO_FUSIONS = kept
    return engines, lines


def graphs_captured(engine: OrtBackend) -> str:
    """How many graph ids (one per buffer set, two for the device greedy step's state parities) a bucketed
    engine's steps ran over."""
    steps = [s for s in (engine.device_steps, engine.device_k_steps) if s is not None]
    if not steps:
        return ""
    return ", ".join(f"{sum(len(b.options) for b in s._bound.values())} graph ids, {s.runs} runs" for s in steps)


def beam_search_op(args: argparse.Namespace, config) -> tuple[Translate | None, str]:  # noqa: ANN001
    """ONNX Runtime's BeamSearch node over the same weights (``--beam-search-op``: its graph, made by
    export.generation_op, fp16 for CUDA) on the provider, or None and why not."""
    if not args.beam_search_op:
        return None, "not run: no --beam-search-op"
    from export.generation_op import BeamSearchOp

    try:
        op = BeamSearchOp.from_graph(str(args.beam_search_op), config.pad_id, config.eos_id, PROVIDERS[args.provider])
        op.translate_ids([[4, 5, 6]], 1)
    except Exception as error:  # noqa: BLE001 (the error is the finding)
        return None, f"not run: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return op.translate_ids, f"ORT BeamSearch node ({args.beam_search_op.name})"


def bucket_section(args, engines, sources, references, expected, tokenizer, lines) -> None:
    """Agreement, BLEU and speed of the bucketed engines against the compact one (and ONNX Runtime's BeamSearch
    node, where given)."""
    translators: dict[str, Translate] = {
        name: (lambda batch_ids, beam, engine=engine: offline.translate_ids(engine, batch_ids, beam))
        for name, engine in engines.items()
    }
    op, why = beam_search_op(args, next(iter(engines.values())).config)
    lines.append(f"| ONNX Runtime's BeamSearch node | {why} |")
    if op is not None:
        translators["ORT BeamSearch node"] = op
    for name, translate in translators.items():
        for beam in (1, 4):
            if beam == 4 and "k=" in name:
                continue  # several steps per run are for greedy batches
            if not in_budget(args, lines, f"agreement of {name}, beam {beam}"):
                return
            _, outputs = rate(translate, sources, 32, beam)
            same = np.mean([a == b for a, b in zip(expected[beam], outputs, strict=True)])
            bleu = sacrebleu.corpus_bleu(tokenizer.decode(outputs), [references]).score
            lines.append(
                f"| {args.provider} fp16 {name}, beam {beam}, batch 32: identical to CPU fp32 | {same:.1%}, "
                f"BLEU {bleu:.2f} (CPU fp32 {expected['bleu'][beam]:.2f}) |"
            )
    if not speed_table(args, translators, sources, lines):
        return
    lines.append("")
    for name, engine in engines.items():
        if engine.device_steps is not None:
            lines.append(f"- {name}: {engine.device_steps.buffers.made} buffer sets made; {graphs_captured(engine)}")


def speed_table(args: argparse.Namespace, translators: dict[str, Translate], sources, lines: Report) -> bool:
    """Output tokens/s of each translator at each batch, greedy and beam 4, medians of ``--repeats`` with the
    translators alternating (several steps per run, "k=", are for greedy only); False if the budget cut it."""
    columns = " | ".join(translators)
    lines += ["", f"| case (output tokens/s) | {columns} |", "|---" * (len(translators) + 1) + "|"]
    for batch in args.batches:
        for beam in (1, 4):
            if not in_budget(args, lines, f"speed at batch {batch}, beam {beam}"):
                return False
            subset = sources[:BATCH_1_SENTENCES] if batch == 1 else sources[: args.speed_sentences]
            rates: dict[str, list[float]] = {name: [] for name in translators}
            for _ in range(args.repeats):
                for name, translate in translators.items():
                    if beam == 1 or "k=" not in name:
                        rates[name].append(rate(translate, subset, batch, beam)[0])
            cells = " | ".join(f"{statistics.median(v):,.0f}" if v else "" for v in rates.values())
            lines.append(f"| batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'} | {cells} |")
    return True


def in_budget(args: argparse.Namespace, lines: Report, what: str) -> bool:
    """Whether ``what`` may start within ``--budget`` (else a line says it was skipped)."""
    if args.budget and time.perf_counter() - STARTED > args.budget:
        lines.append(f"| {what} | skipped: past the {args.budget:.0f} s budget |")
        return False
    return True


def cpu_fp32(model_dir: Path, sources: list[list[int]]) -> dict[int, list[list[int]]]:
    """CPU fp32's outputs at batch 32, greedy (1) and beam 4: what every other engine is compared with."""
    model = OrtBackend(
        model_dir, RuntimeOptions(settings=EngineSettings(variant="fp32", provider="cpu"), spinning=False)
    )
    return {beam: rate(partial(offline.translate_ids, model), sources, 32, beam)[1] for beam in (1, 4)}


def write_reference(args: argparse.Namespace, sources: list[list[int]], tokenizer, references) -> int:
    """CPU fp32's outputs and their BLEU, for a device run's ``--reference``."""
    import json

    made = {"cpu": describe_cpu(), "onnxruntime": ort.__version__, "sentences": len(sources)}
    for beam, outputs in cpu_fp32(args.model, sources).items():
        made[str(beam)] = outputs
        made[f"bleu_{beam}"] = sacrebleu.corpus_bleu(tokenizer.decode(outputs), [references]).score
    args.write_reference.write_text(json.dumps(made))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="an exported folder with fp32 and fp16")
    parser.add_argument("--ct2", type=Path, help="a work folder for CTranslate2's converted model (made if missing)")
    parser.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--data", type=Path, default=MULTI30K)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="the smallest form: 8 sentences, one repeat")
    parser.add_argument("--report", type=Path, help="also write the report here (Markdown)")
    parser.add_argument(
        "--divergence-only", action="store_true", help="only compare each graph node by node with the CPU provider"
    )
    parser.add_argument("--variants", default="fp32,fp16", help="the variants the folder has to run")
    parser.add_argument("--reference", type=Path, help="CPU fp32's outputs (--write-reference) instead of running it")
    parser.add_argument("--write-reference", type=Path, help="write CPU fp32's outputs for --reference, then stop")
    parser.add_argument("--beam-search-op", type=Path, help="ONNX Runtime's BeamSearch graph to time beside ours")
    parser.add_argument("--speed-sentences", type=int, default=1000, help="sentences timed at batch 32 and up")
    parser.add_argument("--budget", type=float, default=0.0, help="seconds after which parts are skipped (0: none)")
    parser.add_argument("--parts", default="agreement,speed,buckets,load", help="the parts to run")
    args = parser.parse_args(argv)
    args.batches = tuple(int(b) for b in args.batches.split(","))
    args.variants = tuple(args.variants.split(","))
    args.parts = set(args.parts.split(","))
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    import json

    args = parse_args(argv)
    if not args.write_reference and PROVIDERS[args.provider] not in ort.get_available_providers():
        print(f"gpu_check: this onnxruntime has no {args.provider} provider (make gpu-check installs onnxruntime-gpu)")
        return 2
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))[: args.sentences]
    references = read_lines(corpus_path(args.data, "test_2016_flickr", "de"))[: args.sentences]
    tokenizer = Tokenizer.load(args.model, read_manifest(args.model, verify=False)["tokenizer"])
    sources = tokenizer.encode_source(texts)
    if args.write_reference:
        return write_reference(args, sources, tokenizer, references)
    options = {"spinning": False} if args.provider == "cpu" else {}
    lines = Report(args.report)
    lines += [
        f"command: python benchmarks/gpu_check.py {shlex.join(sys.argv[1:] if argv is None else argv)}",
        f"machine: {gpu_name()}; {describe_cpu()}; onnxruntime {ort.__version__}; provider {args.provider}; "
        f"{len(texts)} test_2016_flickr sentences; medians of {args.repeats}",
        "",
        "| check | result |",
        "|---|---|",
    ]
    fp16_cpu = OrtBackend(
        args.model, RuntimeOptions(settings=EngineSettings(variant="fp16", provider="cpu"), spinning=False)
    )
    if args.reference:  # CPU fp32's outputs, made on another machine
        made = json.loads(args.reference.read_text())
        assert made["sentences"] >= len(sources), "the reference has fewer sentences than asked for"
        expected = {beam: made[str(beam)][: len(sources)] for beam in (1, 4)}
        lines.append(f"| CPU fp32 reference | made on {made['cpu']}, onnxruntime {made['onnxruntime']} |")
    else:
        expected = cpu_fp32(args.model, sources)
    expected["bleu"] = {b: sacrebleu.corpus_bleu(tokenizer.decode(expected[b]), [references]).score for b in (1, 4)}
    if "buckets" in args.parts and "fp16" in args.variants:
        lines += memcpy_lines(args.model, "fp16", args.provider)
        engines, failed = bucket_engines(args.model, "fp16", args.provider)
        lines += failed
        bucket_section(args, engines, sources, references, expected, tokenizer, lines)
        del engines
        lines += ["", "| check | result |", "|---|---|"]
    # fp32 keeps its cache on the host on CUDA (runtime.device_cache.device_cache_for); fp16 is timed both ways.
    models = {}
    if "fp32" in args.variants:
        models["fp32"] = OrtBackend(
            args.model, RuntimeOptions(settings=EngineSettings(variant="fp32", provider=args.provider), **options)
        )
    if "fp16" in args.variants:
        models["fp16"] = OrtBackend(
            args.model,
            RuntimeOptions(
                settings=EngineSettings(variant="fp16", provider=args.provider), device_cache=True, **options
            ),
        )
        models["fp16, cache on host"] = OrtBackend(
            args.model,
            RuntimeOptions(settings=EngineSettings(variant="fp16", provider=args.provider), device_cache=False),
        )
    on_cpu = {"fp16": fp16_cpu}
    if "fp32" in args.variants:
        on_cpu["fp32"] = OrtBackend(
            args.model, RuntimeOptions(settings=EngineSettings(variant="fp32", provider="cpu"), spinning=False)
        )
    engines: dict[str, Translate] = {
        f"ours {name}": (lambda batch_ids, beam, model=model: offline.translate_ids(model, batch_ids, beam))
        for name, model in models.items()
    }
    ct2, ct2_name = ct2_translator(args.ct2, args.provider) if args.ct2 else (None, "not run: no --ct2")
    if ct2 is not None:
        engines[ct2_name] = ct2
    if "agreement" in args.parts:
        for variant in args.variants:
            if in_budget(args, lines, f"{variant} node by node"):
                lines += divergence(args.model, variant, args.provider, texts)
        if args.divergence_only:
            return 0
        for beam in (1, 4):
            if not in_budget(args, lines, f"agreement, beam {beam}"):
                break
            against = {
                v: rate(partial(offline.translate_ids, model), sources, 32, beam)[1] for v, model in on_cpu.items()
            }
            for name in models:
                variant = name.split(",")[0]
                _, outputs = rate(engines[f"ours {name}"], sources, 32, beam)
                same = np.mean([a == b for a, b in zip(against[variant], outputs, strict=True)])
                lines.append(
                    f"| {args.provider} {name} against CPU {variant}, beam {beam}: identical outputs | {same:.1%} |"
                )
        for name in args.variants:
            _, outputs = rate(engines[f"ours {name}"], sources, 32, 1)
            bleu = sacrebleu.corpus_bleu(tokenizer.decode(outputs), [references]).score
            lines.append(f"| {args.provider} {name}: BLEU, greedy | {bleu:.2f} |")
        lines.append(f"| CTranslate2 | {ct2_name if ct2 is None else f'{ct2_name} on {args.provider}'} |")
        if "fp16" in models:
            lines.append(f"| CUDA graphs (decoder step, fp16) | {capture(models['fp16'], args.provider)} |")
    if "speed" in args.parts:
        speed_table(args, engines, sources, lines)
    if "load" in args.parts and args.load_seconds > 0:
        variant = "fp16" if args.provider == "cuda" else "fp32"
        layouts = [()] if args.provider == "cpu" else [(), ("--batch-layout", "buckets")]
        for extra in layouts:
            for sentences in (1, 16):
                if in_budget(args, lines, f"the server under load, {sentences} sentences a request {extra}"):
                    served = serve_under_load(
                        args.model, args.provider, variant, args.data, args.load_seconds, args.clients, extra, sentences
                    )
                    lines += ["", f"Server under load: {served}"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
