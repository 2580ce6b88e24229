"""common/flags.py: one way from a frozen config dataclass to flags and environment variables, used by the
server, training and export."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from common import flags
from common.flags import setting
from export.pipeline import ExportConfig, MarianLayout
from model.marian import LAYOUTS
from model.train import DEFAULT_MODEL, TrainConfig
from model.train import parse_args as train_args
from runtime.model_config import ModelConfig
from server.config import ServerConfig

Color = Literal["red", "green"]


@dataclass(frozen=True)
class Inner:
    depth: int = setting(2, "how deep")
    color: Color = setting("red", "a color")

    def __post_init__(self) -> None:
        problems = flags.choice_problems(self)
        if self.depth < 0:
            problems.append(f"depth={self.depth} must be at least 0")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class Outer:
    out: Path = setting(help="where")
    inner: Inner = setting(help="nested", factory=lambda: Inner(depth=5))
    ratio: float = setting(0.5, "a ratio")
    quiet: bool = setting(False, "say less")
    files: tuple[Path, ...] = setting((Path("a"),), "files")
    key: Path | None = setting(None, "a key")
    hidden: int = setting(7, flag=False)


def parse(argv, environ=None):
    return flags.parse(Outer, argv, env_prefix="T_", environ=environ or {}, prog="t")


def test_flags_then_variables_then_defaults_with_nested_fields_flattened():
    config = parse(["--out", "o", "--color", "green", "--quiet", "--files", "x", "--files", "y"], {"T_DEPTH": "3"})
    assert config == Outer(Path("o"), Inner(3, "green"), 0.5, True, (Path("x"), Path("y")), None)
    assert parse(["--out", "o"]).inner == Inner(depth=5)  # the outer field's default, not Inner's
    assert parse(["--out", "o", "--depth", "1"], {"T_DEPTH": "3"}).inner.depth == 1
    assert parse(["--out", "o"], {"T_FILES": "p, q", "T_KEY": "k"}).files == (Path("p"), Path("q"))
    assert parse(["--out", "o", "--key", "k"]).key == Path("k")


def test_replace_changes_fields_by_their_flag_names_wherever_they_nest():
    config = parse(["--out", "o"])
    assert flags.replace(config, depth=1, ratio=0.25) == dataclasses.replace(config, inner=Inner(1), ratio=0.25)
    assert flags.replace(config, inner=Inner(9)).inner == Inner(9)  # a nested config given whole
    assert flags.replace(config, hidden=3).hidden == 3  # a field code sets, not a flag
    with pytest.raises(ValueError, match="depth=-1 must be at least 0"):
        flags.replace(config, depth=-1)
    assert flags.names(Outer) == ["out", "depth", "color", "ratio", "quiet", "files", "key"]  # not hidden


@pytest.mark.parametrize(
    ("argv", "value"), [(["--quiet"], True), (["--quiet", "false"], False), (["--no-quiet"], False), ([], False)]
)
def test_booleans_take_a_bare_flag_a_value_or_no(argv, value):
    assert parse(["--out", "o", *argv]).quiet is value


def test_every_problem_is_reported_at_once(capsys):
    with pytest.raises(SystemExit) as exit:
        parse(["--out", "o", "--ratio", "half", "--color", "blue", "--depth", "-1"], {"T_QUIET": "maybe"})
    assert exit.value.code == 2
    error = capsys.readouterr().err
    for expected in (
        "--ratio: 'half' is not a number",
        "--color: 'blue': use red or green",
        "T_QUIET: 'maybe' is not a boolean",
        "depth=-1 must be at least 0",  # the dataclass's own check runs too
    ):
        assert expected in error


def test_required_fields_and_hidden_fields(capsys):
    with pytest.raises(SystemExit):
        parse([])
    assert "--out is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--out", "o", "--hidden", "1"])


def test_help_names_every_flag_with_its_description_default_and_choices(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--color {red,green} a color (env T_COLOR; default red; one of red, green)" in text
    assert "--depth DEPTH how deep (env T_DEPTH; default 5)" in text
    assert "--hidden" not in text


@pytest.mark.parametrize("config", [ServerConfig, TrainConfig, ExportConfig, ModelConfig])
def test_every_entry_points_flags_have_a_description(config):
    for flag in flags._flags(config):
        assert flag.help, f"{config.__name__}.{flag.name} has no --help text"


def test_training_embeds_the_model_config_instead_of_copying_it():
    assert not {f.name for f in dataclasses.fields(TrainConfig)} & {f.name for f in dataclasses.fields(ModelConfig)}
    config = train_args(["--data", "d", "--out", "o", "--d-ff", "2048", "--activation", "swish"])
    assert config.model == dataclasses.replace(DEFAULT_MODEL, d_ff=2048, activation="swish")
    assert train_args(["--data", "d", "--out", "o"]).model.vocab_size == 6000


def test_model_config_reports_all_its_problems():
    with pytest.raises(ValueError) as error:
        ModelConfig(d_model=255, n_heads=4, activation="tanh")
    message = str(error.value)
    assert "activation='tanh': use relu, swish or gelu" in message and "not divisible by n_heads=4" in message
    assert "must be even" in message


def test_export_layout_choices_are_the_marian_writers():
    assert set(typing.get_args(MarianLayout)) == set(LAYOUTS)
