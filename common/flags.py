"""The one way a frozen config dataclass becomes command-line flags (and, for the server, environment variables).
These entry points parse their flags with it: ``python -m model.train``, ``python -m model.translate``,
``python -m export``, ``python -m export.check``, ``python -m server``, ``translate-file`` and
``translate-loadtest``. These write their argparse by hand: ``translate-client`` (its ``--from`` is a Python
keyword, which no field can be named), ``python -m model.marian`` and ``python -m server.operations.keys`` (subcommands,
which this has no way to say), the benchmarks (``python -m export.benchmark`` and the scripts in benchmarks/)
and the test tools (tests/server/fuzz.py, testkit/fault_client.py).

Each field is a flag (``max_batch_size`` → ``--max-batch-size``) described by its ``setting(default, help)``:
``Literal`` types are the flag's choices; ``bool`` takes ``--flag``, ``--flag false`` or ``--no-flag``; a
tuple (``tuple[Path, ...]``, ``tuple[int, ...]``) takes comma-separated items, the flag repeated adding more;
a field without a default is a required flag; a field holding another config dataclass (``TrainConfig.model``)
contributes that dataclass's fields as flags of their own. With an ``env_prefix`` every field is also a
variable (``TRANSLATE_MAX_BATCH_SIZE``): flags win over variables, which win over the defaults. Every problem
(values that do not parse, choices not offered, and the dataclass's own checks) is reported at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_NAMES = {int: "integers", float: "numbers", Path: "paths"}


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable | None = None, flag: bool = True):
    """A config field with its --help text; ``flag=False`` keeps it off the command line (set by code)."""
    metadata = {"help": help, "flag": flag}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def choices(kind: Any) -> tuple | None:
    """The allowed values of a ``Literal`` type (optionally ``| None``), else None."""
    if typing.get_origin(kind) is Literal:
        return typing.get_args(kind)
    return None


def choice_problems(config: Any) -> list[str]:
    """``name='value': use a, b or c`` for every ``Literal`` field of ``config`` holding another value."""
    problems = []
    for name, kind in typing.get_type_hints(type(config)).items():
        allowed = choices(kind)
        value = getattr(config, name, None)
        if allowed and value not in allowed:
            problems.append(f"{name}={value!r}: use {_either(allowed)}")
    return problems


def type_problems(config: Any) -> list[str]:
    """``name=value: use a bool`` for every field of a plain type (``bool``, ``int``, ``float``, ``str``, ``Path``
    or a config dataclass, optionally ``| None``) holding a value of another type; a bool is no integer here."""
    problems = []
    for name, kind in typing.get_type_hints(type(config)).items():
        value, plain = getattr(config, name, None), _optional(kind) or kind
        if not isinstance(plain, type) or (value is None and _optional(kind)):
            continue  # Literal (choice_problems), tuples, unions
        fits = isinstance(value, plain) and not (plain in (int, float) and isinstance(value, bool))
        if not (fits or (plain is float and isinstance(value, int) and not isinstance(value, bool))):
            problems.append(f"{name}={value!r}: use {'an' if plain is int else 'a'} {plain.__name__}")
    return problems


def _either(values: Sequence) -> str:
    values = [str(v) for v in values]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]


@dataclasses.dataclass(frozen=True)
class _Flag:
    name: str  # the field's name
    owner: tuple[str, ...]  # the path of nested config fields holding it ((): the top config)
    kind: Any  # the resolved type
    default: Any
    required: bool
    help: str

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.kind) is tuple

    @property
    def is_bool(self) -> bool:
        return self.kind is bool

    def parse(self, text: str) -> Any:
        """The value of ``text`` (a flag's or variable's), or ValueError saying what was expected."""
        kind = self.kind
        if _optional(kind) is not None:
            if text.strip().lower() in ("", "none"):
                return None
            kind = _optional(kind)
        if self.is_list:  # comma-separated items ('' is none)
            item = typing.get_args(kind)[0]
            try:
                return tuple(item(part.strip()) for part in text.split(",") if part.strip())
            except ValueError:
                raise ValueError(f"{text!r}: use comma-separated {_NAMES.get(item, 'values')}") from None
        if kind is bool:
            if text.lower() in TRUE:
                return True
            if text.lower() in FALSE:
                return False
            raise ValueError(f"{text!r} is not a boolean (true or false)")
        allowed = choices(kind)
        if allowed:
            if text not in allowed:
                raise ValueError(f"{text!r}: use {_either(allowed)}")
            return text
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        return Path(text) if kind is Path else text


def _optional(kind: Any) -> Any:
    """X for ``X | None``, else None."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0]
    return None


def _default(field: dataclasses.Field) -> Any:
    """A field's default value (made by its factory), or MISSING."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _flags(cls: type, owner: tuple[str, ...] = (), defaults: Any = None) -> list[_Flag]:
    hints = typing.get_type_hints(cls)
    flags = []
    for field in dataclasses.fields(cls):
        if not field.metadata.get("flag", True):
            continue
        kind = hints[field.name]
        default = _default(field) if defaults is None else getattr(defaults, field.name)
        if dataclasses.is_dataclass(kind):
            flags.extend(_flags(kind, (*owner, field.name), default))
            continue
        required = default is dataclasses.MISSING
        flags.append(_Flag(field.name, owner, kind, default, required, field.metadata.get("help", "")))
    return flags


def names(cls: type) -> list[str]:
    """The names of ``cls``'s flags (``max_batch_size`` for ``--max-batch-size``), nested configs' included;
    upper-cased after the prefix, its environment variables' (``TRANSLATE_MAX_BATCH_SIZE``)."""
    return [flag.name for flag in _flags(cls)]


def parser_for(cls: type, env_prefix: str | None = None, **parser_args) -> argparse.ArgumentParser:
    """An ArgumentParser with a flag per field of ``cls`` (values are parsed by ``parse``, not argparse)."""
    parser = argparse.ArgumentParser(**parser_args)
    for flag in _flags(cls):
        notes = [f"env {env_prefix}{flag.name.upper()}"] if env_prefix else []
        if flag.required:
            notes.append("required")
        else:
            notes.append("default " + (",".join(map(str, flag.default)) if flag.is_list else str(flag.default)))
        allowed = choices(flag.kind) or choices(_optional(flag.kind))
        if allowed:
            notes.append("one of " + ", ".join(map(str, allowed)))
        help = f"{flag.help} ({'; '.join(notes)})".strip().replace("%", "%%")
        metavar = "{" + ",".join(allowed) + "}" if allowed else flag.name.upper()
        if flag.is_bool:
            parser.add_argument(flag.option, nargs="?", const="true", metavar="BOOL", help=help)
            parser.add_argument(
                "--no-" + flag.option[2:], dest=flag.name, action="store_const", const="false", help=argparse.SUPPRESS
            )
        elif flag.is_list:
            parser.add_argument(flag.option, action="append", metavar=metavar, help=help)
        else:
            parser.add_argument(flag.option, metavar=metavar, help=help)
    return parser


def parse(
    cls: type[T],
    argv: Sequence[str] | None = None,
    *,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
    **parser_args,
) -> T:
    """``cls`` from flags, then ``env_prefix`` variables, then defaults; every problem reported at once (exit 2,
    argparse's usage error)."""
    parser = parser_for(cls, env_prefix, **parser_args)
    args = vars(parser.parse_args(argv))
    environ = environ if environ is not None else (os.environ if env_prefix else {})
    problems: list[str] = []
    values: dict[tuple[str, ...], dict[str, Any]] = {}
    complete = True
    for flag in _flags(cls):
        given = args.get(flag.name)
        variable = f"{env_prefix}{flag.name.upper()}" if env_prefix else None
        try:
            if given is not None:
                value = sum(map(flag.parse, given), ()) if flag.is_list else flag.parse(given)
            elif variable and variable in environ:
                value = flag.parse(environ[variable])
            elif flag.required:
                problems.append(f"{flag.option} is required")
                complete = False
                continue
            else:
                continue  # the field's default
        except ValueError as error:  # reported; the default stands in so the config's own checks still run
            problems.append(f"{flag.option if given is not None else variable}: {error}")
            continue
        values.setdefault(flag.owner, {})[flag.name] = value
    if complete:
        try:
            config = _build(cls, values)
            if not problems:
                return config
        except ValueError as error:
            problems.append(str(error))
    parser.error("; ".join(problems))
    raise AssertionError("parser.error exits")


def command(cls: type[T], argv: Sequence[str] | None, prog: str, doc: str | None) -> T:
    """``parse`` for a command whose module docstring ``doc`` is its help, kept as written."""
    return parse(cls, argv, prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def replace(config: T, **changes: Any) -> T:
    """``config`` with fields changed by their flag names, wherever they nest (``ServerConfig``'s
    ``max_batch_size=8`` changes ``config.scheduling.max_batch_size``), each config checking itself again. A
    nested config may also be given whole, by its field's name."""
    owners = {flag.name: flag.owner for flag in _flags(type(config))}
    values: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, value in changes.items():
        values.setdefault(owners.get(name, ()), {})[name] = value
    return _build(type(config), values, base=config)


def _build(
    cls: type[T], values: dict[tuple[str, ...], dict[str, Any]], owner: tuple[str, ...] = (), base: Any = None
) -> T:
    """``cls`` (or ``base`` with changes) from the parsed values at ``owner``, nested configs built from theirs
    over their defaults (or taken as given whole)."""
    hints = typing.get_type_hints(cls)
    changes = dict(values.get(owner, {}))
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if field.metadata.get("flag", True) and dataclasses.is_dataclass(kind) and field.name not in changes:
            inner = _default(field) if base is None else getattr(base, field.name)
            changes[field.name] = _build(kind, values, (*owner, field.name), inner)
    return cls(**changes) if base is None else dataclasses.replace(base, **changes)
