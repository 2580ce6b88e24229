"""Training end to end on a generated task: reverse a sequence of letters."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from model.checkpoint import load_checkpoint
from model.train import learning_rate, main
from model.translate import TorchTranslator

LETTERS = "abcdefghij"
TINY = ["--vocab-size", "16", "--d-model", "64", "--n-heads", "4", "--n-encoder-layers", "2",
        "--n-decoder-layers", "2", "--d-ff", "128", "--dropout", "0", "--lr", "3e-3", "--warmup", "100",
        "--max-tokens", "500", "--threads", "1"]  # fmt: skip


def write_reverse_task(directory: Path, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    for split, n in (("train", 3000), ("val", 100)):
        src = [" ".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 8))) for _ in range(n)]
        (directory / f"{split}.en").write_text("\n".join(src) + "\n")
        (directory / f"{split}.de").write_text("\n".join(" ".join(reversed(s.split())) for s in src) + "\n")
    return src


def test_schedule_warms_up_then_decays():
    assert learning_rate(50, 1e-3, 100) == pytest.approx(5e-4)
    assert learning_rate(100, 1e-3, 100) == pytest.approx(1e-3)
    assert learning_rate(400, 1e-3, 100) == pytest.approx(5e-4)


def test_tiny_model_learns_to_reverse(tmp_path: Path):
    val_sources = write_reverse_task(tmp_path)
    out = tmp_path / "out"
    main(["--data", str(tmp_path), "--out", str(out), "--epochs", "10", "--average", "2", *TINY])
    model, tokenizer = load_checkpoint(out)
    hypotheses = TorchTranslator(model, tokenizer).translate(val_sources)
    references = [" ".join(reversed(s.split())) for s in val_sources]
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references)
    assert exact >= 0.95, list(zip(hypotheses, references, strict=True))[:5]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["train_loss"] > log[-2]["train_loss"], "training loss must fall"
    assert "final" in log[-1] and (out / "config.json").exists()

    # Resume: continue from the saved state for one more epoch.
    main(["--data", str(tmp_path), "--out", str(out), "--epochs", "11", "--average", "2", "--resume", *TINY])
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    resumed = [r for r in log if r.get("epoch") == 11]
    assert resumed and resumed[0]["step"] > 10 * 60


def test_distributed_training_with_two_gloo_processes(tmp_path: Path):
    write_reverse_task(tmp_path)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "model.train", "--data", str(tmp_path), "--out", str(out), "--epochs", "1", "--max-steps", "8",
           "--average", "1", *TINY]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 8 and log[0]["epoch"] == 1
    model, _ = load_checkpoint(out)
    assert model.num_parameters() > 0
