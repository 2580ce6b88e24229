from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm

from client import loadtest
from runtime.cpu import describe_cpu
from server.documents.text import split_sentences
from server.errors import ServiceError, grpc_code_of_http
from testkit.servers import RunningServer, start_server


@pytest.fixture(scope="module")
def tokenizer(tiny_export: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(tiny_export / "sentencepiece.model"))


@pytest.mark.parametrize("tokens", [16, 64, 256, 1024])
def test_fixed_profile_gives_the_token_count_asked_for(tokenizer, tokens: int):
    text, counted = loadtest.Profile(f"fixed:{tokens}", tokenizer).next()
    assert counted == len(tokenizer.encode(text))
    assert tokens - 2 - tokens // 50 <= counted <= tokens


def test_mix_profile_draws_both_ranges(tokenizer):
    profile = loadtest.Profile("mix:50:10-20:100-120", tokenizer, seed=1)
    lengths = [profile.length() for _ in range(200)]
    assert all(10 <= n <= 20 or 100 <= n <= 120 for n in lengths)
    assert 60 < sum(n <= 20 for n in lengths) < 140


def test_run_on_profile_gives_one_sentence_texts(tokenizer):
    profile = loadtest.Profile("mix:50:10-20:200-300:run-on", tokenizer, seed=2)
    texts = [profile.next() for _ in range(20)]
    assert any(tokens >= 200 for _, tokens in texts)
    # (The tiny test vocabulary decodes letters it lacks as "⁇", which a sentence splitter takes for "??".)
    assert all(len(split_sentences(text.replace("⁇", ""))) == 1 for text, _ in texts)
    documents = [loadtest.Profile("fixed:200", tokenizer, seed=2).next()[0]]
    assert len(split_sentences(documents[0])) > 5  # without :run-on a long text is many sentences


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Forty made-up sentences, each naming its number."""
    path = tmp_path / "corpus.en"
    path.write_text("".join(f"The dog number {i} runs across the green field.\n" for i in range(40)))
    return path


def test_corpus_profile_mixes_sentences_and_documents_of_its_lines(tokenizer, corpus: Path):
    lines = corpus.read_text().splitlines()
    profile = loadtest.Profile(f"corpus:{corpus}:70:doc:3-5:0", tokenizer, seed=3)
    texts = [profile.next()[0] for _ in range(300)]
    singles = [t for t in texts if t in lines]
    documents = [[s for s, _ in split_sentences(t)] for t in texts if t not in lines]
    assert 150 < len(singles) < 250 and len(singles) + len(documents) == 300
    assert all(3 <= len(d) <= 5 and all(s in lines for s in d) for d in documents)
    # Nothing repeats until every line was sent once: new sentences come in file order.
    assert len(set(profile.sent[:40])) == 40 and profile.sent[40:80] == profile.sent[:40]


@pytest.mark.parametrize("repeated", [0, 50, 90])
def test_corpus_profile_repeats_the_share_of_sentences_asked_for(tokenizer, corpus: Path, repeated: int):
    big = corpus.parent / "big.en"
    big.write_text("".join(f"A cat called number {i} sleeps.\n" for i in range(5000)))
    profile = loadtest.Profile(f"corpus:{big}:100:doc:1-1:{repeated}", tokenizer, seed=4)
    texts = [profile.next()[0] for _ in range(2000)]
    assert abs((1 - len(set(texts)) / len(texts)) * 100 - repeated) < 4


def test_corpus_run_on_texts_are_one_sentence_of_the_length_asked_for(tokenizer, corpus: Path):
    profile = loadtest.Profile(f"corpus:{corpus}:0:run-on:100-120:0", tokenizer, seed=5)
    for _ in range(5):
        text, tokens = profile.next()
        assert 100 - 3 <= tokens <= 120
        assert len(split_sentences(text.replace("⁇", ""))) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("corpus:{path}:70:doc:3-5", "bad profile"),
        ("corpus:{path}:x:doc:3-5:0", "bad profile"),
        ("corpus:{path}:70:essay:3-5:0", "doc or run-on, not 'essay'"),
        ("poem:3", "unknown profile"),
    ],
)
def test_bad_profiles_say_what_is_accepted(tokenizer, corpus: Path, spec: str, message: str):
    with pytest.raises(ValueError, match=message):
        loadtest.Profile(spec.format(path=corpus), tokenizer)


def bounded_load(port: int, metrics_port: int, export: Path, out: Path) -> list[str]:
    """Flags for 12 requests at concurrency 1, then 4, of 4-40 tokens each."""
    return [
        *("--target", f"127.0.0.1:{port}", "--metrics", f"http://127.0.0.1:{metrics_port}/metrics"),
        *("--tokenizer", str(export / "sentencepiece.model"), "--profile", "uniform:4-40"),
        *("--concurrency", "1,4", "--requests", "12", "--out", str(out)),
    ]


def test_bounded_load_is_counted_exactly(running: RunningServer, tiny_export: Path, tmp_path: Path):
    assert loadtest.main(bounded_load(running.server.port, running.server.metrics_port, tiny_export, tmp_path)) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [run["requests"] for run in report["runs"]] == [12, 12]
    assert [len(results) for results in report["results"]] == [12, 12]
    assert all(run["codes"] == {"OK": 12} for run in report["runs"])
    assert report["runs"][1]["latency"]["p50"] > 0
    assert report["runs"][1]["server"]["translate_requests_total_delta"] == 12
    busy = report["runs"][1]["server_cores_busy"]  # the server (and this client) share this process
    assert set(busy) == {"all", "front_door", "lanes", "grpc", "other"} and busy["all"] > 0
    tick = 0.01 / report["runs"][1]["seconds"]  # /proc counts CPU time in clock ticks, per thread
    assert all(value >= -tick for value in busy.values())
    assert busy["all"] >= sum(busy.values()) - busy["all"] - 4 * tick  # the kinds add up to the process at most
    assert report["runs"][1]["client_cores_busy"] > 0  # this process's CPU over the run, the server's included
    for name in ("latency_vs_length.png", "throughput_vs_concurrency.png"):
        assert (tmp_path / name).stat().st_size > 5000
    report = (tmp_path / "report.md").read_text()
    assert "| closed | 4 | 12 |" in report and f"client machine: {describe_cpu()}" in report
    assert " | server cores busy | client cores busy |" in report and "(front_door " in report


def test_open_loop_with_deadlines_counts_errors(running: RunningServer, tiny_export: Path, tmp_path: Path):
    args = [
        "--target",
        f"127.0.0.1:{running.server.port}",
        "--metrics",
        "",
        "--tokenizer",
        str(tiny_export / "sentencepiece.model"),
        "--profile",
        "fixed:30",
        "--rate",
        "50",
        "--requests",
        "10",
        "--deadline",
        "0.0001",
        "--out",
        str(tmp_path),
    ]
    assert loadtest.main(args) == 0
    run = json.loads((tmp_path / "report.json").read_text())["runs"][0]
    assert run["requests"] == 10 and sum(run["codes"].values()) == 10
    assert run["codes"].get("DEADLINE_EXCEEDED", 0) >= 1


def test_http_api_is_driven_the_same_way(tiny_export: Path, tmp_path: Path):
    server = start_server(tiny_export)
    try:
        args = bounded_load(server.server.http_port, server.server.metrics_port, tiny_export, tmp_path)
        assert loadtest.main(["--api", "http", *args]) == 0
        report = json.loads((tmp_path / "report.json").read_text())
        assert all(run["codes"] == {"OK": 12} for run in report["runs"])
        assert report["runs"][1]["server"]["translate_requests_total_delta"] == 12
        assert all(r["output_tokens"] > 0 for r in report["results"][1])
        bad = [
            "--api",
            "http",
            "--target",
            f"127.0.0.1:{server.server.http_port}",
            "--metrics",
            "",
            "--tokenizer",
            str(tiny_export / "sentencepiece.model"),
            "--languages",
            "de:en",
            "--requests",
            "3",
        ]
        assert loadtest.main(bad + ["--out", str(tmp_path / "bad")]) == 0
        bad_report = json.loads((tmp_path / "bad" / "report.json").read_text())
        assert bad_report["runs"][0]["codes"] == {"INVALID_ARGUMENT": 3}
    finally:
        server.close()


def test_http_statuses_are_reported_under_the_grpc_code_the_server_maps_them_from():
    errors = [ServiceError, *ServiceError.__subclasses__()]
    for error in errors:
        sharing = {e.code.name for e in errors if e.http_status == error.http_status}  # 403: a missing or bad key
        assert grpc_code_of_http(error.http_status) in sharing | {"INTERNAL"}  # 500 is INTERNAL's
    assert grpc_code_of_http(200) == "OK" and grpc_code_of_http(418) == "HTTP_418"


def test_a_benchmarks_bounded_run_targets_the_port_and_scrapes_nothing():
    args = loadtest.bounded(5123, 7, 30, "--api", "http", "--deadline", "9")
    assert (args.target, args.requests, args.duration, args.metrics) == ("127.0.0.1:5123", 7, 30.0, "")
    assert (args.api, args.deadline) == ("http", 9.0)
    assert loadtest.bounded(5123, 7).duration == 600.0


def test_a_metrics_address_without_its_scheme_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        loadtest.parse_args(["--metrics", "127.0.0.1:9464"])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in error
    assert "--metrics '127.0.0.1:9464': give its URL, e.g. http://127.0.0.1:9464/metrics" in error
    assert loadtest.parse_args(["--metrics", ""]).metrics == ""
