"""The memory budget holds for real: resident memory under concurrent 1,000-token inputs."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from runtime.engine import Engine
from runtime.options import EngineSettings, RuntimeOptions
from server.config import MIB
from testkit.sentences import OWN_SENTENCES, own_sentences
from testkit.servers import RunningServer, server_config

LONG_TOKENS = 1000


@pytest.fixture(scope="module")
def wide_export(tmp_path_factory) -> Path:
    """A random model as wide as the default one (d_model 256), two layers each side, exported fp32: big
    enough that its caches and encoder states stand out from the process's own noise."""
    import torch

    from export.__main__ import main as export_main
    from model.checkpoint import save_checkpoint
    from model.transformer import Transformer
    from runtime.model_config import ModelConfig
    from runtime.tokenizer import Tokenizer

    texts = own_sentences(240) + [german for _, german in OWN_SENTENCES]
    tokenizer, blob = Tokenizer.train(texts * 3, vocab_size=120)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=256,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=512,
        dropout=0.0,
    )
    torch.manual_seed(0)
    checkpoint = tmp_path_factory.mktemp("wide_checkpoint")
    save_checkpoint(checkpoint, Transformer(config), blob, {"name": "wide-test"})
    out = tmp_path_factory.mktemp("wide_export") / "model"
    assert export_main(["--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    return out


def long_text(engine: Engine, tokens: int) -> str:
    """One sentence (the server translates sentence by sentence) of at most ``tokens`` tokens, nearly that
    many: the words of our sentences without their full stops."""
    words = " ".join(own_sentences(400)).replace(".", "").split()
    low, high = 1, len(words)
    while low < high:  # the most words that stay within the limit
        middle = (low + high + 1) // 2
        if len(engine.tokenize([" ".join(words[:middle])])[0]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low])


def test_concurrent_long_inputs_stay_within_the_memory_budget(wide_export: Path):
    engine = Engine(wide_export, RuntimeOptions(settings=EngineSettings(provider="cpu")))
    text = long_text(engine, LONG_TOKENS)
    n = len(engine.tokenize([text])[0])
    assert n > 0.95 * LONG_TOKENS
    max_output = 16
    one = engine.memory.sequence_bytes(n, max_output, 4) + engine.memory.encoder_scores_bytes(1, n)
    budget_mib = math.ceil(1.5 * one / MIB)  # room for one such request being encoded at a time, not eight
    server = RunningServer(
        server_config(
            wide_export,
            memory_budget_mib=budget_mib,
            max_source_tokens=1024,
            long_input_tokens=1024,
            max_output_tokens=max_output,
        )
    )
    process = psutil.Process()
    try:
        # The first long requests' one-time allocations are not the budget's: one in each of the long lane's
        # replicas (its thread's heap), at once, so that each goes to its own.
        replicas = sum(lane.size_class == 1 for lane in server.server.scheduler.lanes)
        with ThreadPoolExecutor(replicas) as pool:
            list(pool.map(lambda _: server.translate([text], beam=4), range(replicas)))
        baseline, peaks, running = process.memory_info().rss, {"rss": 0, "reserved": 0.0, "inflight": 0.0}, True

        def sample() -> None:
            while running:
                peaks["rss"] = max(peaks["rss"], process.memory_info().rss)
                peaks["reserved"] = max(peaks["reserved"], server.metric("translate_memory_reserved_bytes"))
                peaks["inflight"] = max(peaks["inflight"], server.metric("translate_inflight_sequences"))
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda beam: server.translate([text], beam=beam), [1, 4] * 4))
        running = False
        sampler.join()
    finally:
        server.close()
    assert all(len(r.translations) == 1 for r in results)  # every request answered
    assert 0 < peaks["reserved"] <= budget_mib * MIB
    assert peaks["inflight"] < 8  # the budget held some requests back
    growth = peaks["rss"] - baseline
    assert growth <= 1.1 * budget_mib * MIB, f"resident memory grew {growth / MIB:.1f} MiB, budget {budget_mib} MiB"
