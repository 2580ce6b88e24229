"""Our engine against CTranslate2 on the same weights and token ids (``python -m export.benchmark
--against ctranslate2``; needs the ``marian`` extra).

Default model: the checkpoint is exported to the Marian format (its default, OPUS-MT layout) and
converted by CTranslate2's own converter. ``--base-sized``: a transformer-base-sized Marian model
(d_model 512, 8 heads, 6+6 layers, FFN 2048, swish, 32k vocabulary) with random weights made by
``transformers``, converted by CTranslate2 and imported and exported by us; random weights never
emit eos, so both engines are capped at the same output length (``--cap``, 40 there).

Both engines translate the same test_2016_flickr token ids with the same thread count (``--threads``
per batch, or ``--workers`` batches at once on one thread each: ours on threads sharing one model as
translate-file's workers do, CT2 with as many ``inter_threads``) and output
cap (ours counts eos: min(cap, 2·source + 11); CT2 gets that minus one), alternating engines within
each repeat. Output tokens/s (each best hypothesis' tokens + eos), medians. CTranslate2 runs in one
compute type per run (--ct2-compute-type; by default its faster one on each model, see run_benchmark).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from common.corpus import corpus_path, read_lines
from runtime import offline
from runtime.backend import OrtBackend
from runtime.cpu import describe_cpu
from runtime.manifest import sha256
from runtime.options import EngineSettings, RuntimeOptions
from runtime.search import default_max_output
from runtime.translate_file import runtime_options

CASES = ((1, 1, 150), (32, 1, 1000), (1, 4, 150), (32, 4, 1000))  # batch, beam, sentences
BASE_SIZED_CASES = ((1, 1, 60), (32, 1, 320), (1, 4, 60), (32, 4, 320))  # every output is 40 tokens there
BASE_SIZED = {"d_model": 512, "heads": 8, "layers": 6, "ffn": 2048, "vocab": 32000}
Run = Callable[[list[list[int]], int, int], list[list[int]]]
ORT_OP = "ORT BeamSearch op fp32"


def base_sized_marian(folder: Path, spm: Path) -> Path:
    """A random transformer-base-sized Hugging Face Marian folder. Its vocabulary is our sentencepiece
    model's pieces (so test sentences tokenize to real ids) padded with unused pieces to 32k, in
    OPUS-MT's layout: </s> 0, <unk> 1, <pad> last, which is also the start token."""
    import sentencepiece
    import torch
    from transformers import MarianConfig, MarianMTModel

    if (folder / "config.json").exists():
        return folder
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    ordinary = [p for p in pieces if p not in ("<pad>", "<unk>", "<s>", "</s>")]
    size = BASE_SIZED["vocab"]
    names = ["</s>", "<unk>", *ordinary]
    names += [f"<unused_{i}>" for i in range(size - 1 - len(names))] + ["<pad>"]
    config = MarianConfig(
        vocab_size=size,
        decoder_vocab_size=size,
        d_model=BASE_SIZED["d_model"],
        encoder_layers=BASE_SIZED["layers"],
        decoder_layers=BASE_SIZED["layers"],
        encoder_attention_heads=BASE_SIZED["heads"],
        decoder_attention_heads=BASE_SIZED["heads"],
        encoder_ffn_dim=BASE_SIZED["ffn"],
        decoder_ffn_dim=BASE_SIZED["ffn"],
        activation_function="swish",
        pad_token_id=size - 1,
        eos_token_id=0,
        decoder_start_token_id=size - 1,
        max_position_embeddings=512,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    MarianMTModel(config).save_pretrained(folder, safe_serialization=True)
    for name in ("source.spm", "target.spm"):
        shutil.copy(spm, folder / name)
    (folder / "vocab.json").write_text(json.dumps({name: i for i, name in enumerate(names)}))
    tokenizer_config = {"source_lang": "en", "target_lang": "de", "separate_vocabs": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def export_code_digest() -> str:
    """One digest of the code that writes our exported folders (the graphs' builders and the step's contract)."""
    files = sorted(Path(__file__).parent.glob("*.py")) + [Path(__file__).parents[1] / "runtime" / "contract.py"]
    return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()


def prepare(args, work: Path) -> tuple[Path, Path, Callable[[int], int], Callable[[str], int]]:
    """(our exported folder with fp32 and int8, CT2's converted folder, our id -> CT2 piece, CT2 piece -> our id)."""
    import ctranslate2

    from export.__main__ import main as export_main
    from model.checkpoint import DEFAULT_CHECKPOINT, WEIGHTS_FILE
    from model.marian import import_marian, opus_mt_order

    work.mkdir(parents=True, exist_ok=True)
    ours, converted = work / "onnx", work / "ct2"
    if args.base_sized:
        marian = base_sized_marian(work / "marian", DEFAULT_CHECKPOINT / "sentencepiece.model")
        checkpoint = work / "checkpoint"
        if not checkpoint.exists():
            import_marian(marian, checkpoint, metadata={"source_language": "en", "target_language": "de"})
    else:
        checkpoint, marian = args.checkpoint, work / "marian"
    # What the work folder was made from: a checkpoint whose weights changed since makes everything again,
    # and a change to the code that writes our graphs (export/*.py, runtime/contract.py) remakes our folder.
    weights, stamp = sha256(checkpoint / WEIGHTS_FILE), work / "checkpoint.sha256"
    if not stamp.exists() or stamp.read_text() != weights:
        for folder in (ours, converted) if args.base_sized else (ours, converted, marian):
            shutil.rmtree(folder, ignore_errors=True)
    code, code_stamp = export_code_digest(), work / "export-code.sha256"
    if not code_stamp.exists() or code_stamp.read_text() != code:
        shutil.rmtree(ours, ignore_errors=True)
    if (
        not args.base_sized
        and not (marian / "config.json").exists()
        and export_main(["--format", "marian", "--checkpoint", str(checkpoint), "--out", str(marian), "--force"])
    ):
        raise SystemExit(f"the Marian export of {checkpoint} failed (see above)")
    if not (ours / "manifest.json").exists() and export_main(
        ["--checkpoint", str(checkpoint), "--out", str(ours), "--int8", "--force"]
    ):
        raise SystemExit(f"the ONNX export of {checkpoint} failed (see above)")
    if not (converted / "model.bin").exists():
        ctranslate2.converters.TransformersConverter(str(marian)).convert(str(converted), force=True)
    stamp.write_text(weights)
    code_stamp.write_text(code)
    vocab = json.loads((marian / "vocab.json").read_text())
    piece = {i: p for p, i in vocab.items()}
    if args.base_sized:  # imported: our ids are the Marian ids
        return ours, converted, lambda i: piece[i], lambda p: vocab[p]
    config = OrtBackend(ours, RuntimeOptions(settings=EngineSettings(variant="fp32", provider="cpu"))).config
    order = opus_mt_order(config).numpy()  # Marian id -> our id
    to_theirs = np.argsort(order)
    return ours, converted, lambda i: piece[int(to_theirs[i])], lambda p: int(order[vocab[p]])


def run_benchmark(args) -> int:
    import ctranslate2
    import torch

    # Preparing runs torch (export, import, the id order); torch's OpenMP pool, once started, slows CT2's
    # float32 5x (358 against 1,677 tok/s at batch 1, measured): it gets one thread.
    torch.set_num_threads(1)

    work = args.work_dir / ("base-sized" if args.base_sized else "default")
    ours_dir, converted, to_piece, to_id = prepare(args, work)
    cap = args.cap or (40 if args.base_sized else 256)
    threads = 1 if args.workers > 1 else args.threads
    ours = {
        variant: OrtBackend(
            ours_dir, runtime_options(EngineSettings(variant=variant, provider="cpu", intra_op_threads=threads))
        )
        for variant in ("fp32", "int8")
    }
    texts = read_lines(corpus_path(args.data, "test_2016_flickr", "en"))
    tokenizer = ours["fp32"].tokenizer

    def in_batches(translate: Callable[[list[list[int]], int], list[list[int]]]) -> Run:
        """The sources in batches of ``batch``, in order, ``--workers`` batches at once."""

        def run(sources: list[list[int]], batch: int, beam: int) -> list[list[int]]:
            batches = [sources[i : i + batch] for i in range(0, len(sources), batch)]
            if args.workers == 1:
                return [out for batch_ids in batches for out in translate(batch_ids, beam)]
            with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
                return [out for outs in pool.map(lambda batch_ids: translate(batch_ids, beam), batches) for out in outs]

        return run

    def run_ours(model: OrtBackend) -> Run:
        return in_batches(lambda batch_ids, beam: offline.translate_ids(model, batch_ids, beam, cap))

    def run_theirs(translator) -> Run:
        def translate(batch_ids: list[list[int]], beam: int) -> list[list[int]]:
            pieces = [[to_piece(t) for t in row] + ["</s>"] for row in batch_ids]
            limit = max(default_max_output(len(row), cap) for row in batch_ids) - 1
            results = translator.translate_batch(
                pieces, beam_size=beam, max_batch_size=len(batch_ids), max_decoding_length=limit
            )
            return [[to_id(p) for p in r.hypotheses[0]] for r in results]

        return in_batches(translate)

    def rate(run: Run, sources: list[list[int]], batch: int, beam: int) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        outputs = run(sources, batch, beam)
        return sum(len(o) + 1 for o in outputs) / (time.perf_counter() - start), outputs

    def translator(compute_type: str):
        return ctranslate2.Translator(
            str(converted), "cpu", compute_type=compute_type, inter_threads=args.workers, intra_threads=threads
        )

    print(f"command: python -m export.benchmark {shlex.join(sys.argv[1:])}")
    print(
        f"machine: {describe_cpu()}; "
        f"{f'{args.workers} batches at once on 1 thread' if args.workers > 1 else f'{threads} threads'} each; "
        f"onnxruntime {ort.__version__}, ctranslate2 {ctranslate2.__version__}; medians of {args.repeats}; "
        f"{'base-sized random model' if args.base_sized else 'default model'}, outputs capped at {cap} tokens\n"
    )

    # Exactly one CT2 translator per process: its OpenMP threads spin, and every further translator (a
    # second compute type, a fresh one per run) slowed CT2 itself up to 5x when tried. Its compute type is
    # float32 on the default model and int8 on the base-sized one (each its faster there, both measured).
    fastest = args.ct2_compute_type or ("int8" if args.base_sized else "float32")
    ct2 = f"CT2 {fastest}"
    engines = {
        "ours fp32": run_ours(ours["fp32"]),
        "ours int8": run_ours(ours["int8"]),
        ct2: run_theirs(translator(fastest)),
    }
    if args.ort_beam_search:  # ONNX Runtime's own loop over the same weights (export/generation_op.py)
        from export.generation_op import BeamSearchOp
        from model.checkpoint import load_checkpoint

        checkpoint = work / "checkpoint" if args.base_sized else args.checkpoint
        op = BeamSearchOp(load_checkpoint(checkpoint)[0], threads)
        engines[ORT_OP] = in_batches(lambda batch_ids, beam: op.translate_ids(batch_ids, beam, cap))
    extra = f" {ORT_OP} |" if args.ort_beam_search else ""
    columns = f"| case | ours fp32 | ours int8 | {ct2} |{extra}"
    print(f"{columns} best ours / CT2 | fp32 / {ct2} | identical (best ours vs CT2) |")
    print("|---|---|---|---|---|---|---|" + ("---|" if extra else ""))
    for batch, beam, count in BASE_SIZED_CASES if args.base_sized else CASES:
        count = min(count, args.sentences) if args.sentences else count
        sources = tokenizer.encode_source(texts[:count])
        rates: dict[str, list[float]] = {name: [] for name in engines}
        outputs = {}
        for _ in range(args.repeats):
            for name, run in engines.items():
                value, outputs[name] = rate(run, sources, batch, beam)
                rates[name].append(value)
        med = {name: statistics.median(r) for name, r in rates.items()}
        best = max(("ours fp32", "ours int8"), key=med.get)
        same = np.mean([a == b for a, b in zip(outputs[best], outputs[ct2], strict=True)])
        name = f"batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'}"
        cells = " | ".join(f"{med[n]:,.0f}" for n in engines)
        print(
            f"| {name} | {cells} | {med[best] / med[ct2]:.2f} ({best}) | "
            f"{med['ours fp32'] / med[ct2]:.2f} | {same:.1%} |",
            flush=True,
        )
    return 0
