"""Load a run config from YAML plus dotted command-line overrides, with errors a person can act on.

Every failure is a ``ConfigError`` whose message starts with where the bad value came from:
``FILE:LINE: dotted.key: problem`` for values written in the file, and
``FILE: dotted.key: problem; set by override 'a.b=c'`` for values set on the command line.
Line numbers come from the composed YAML node tree, which keeps each key's position.

YAML is read with PyYAML's safe loader, changed in two ways (YAML 1.2 behaviour): ``1e-5`` is a
float (YAML 1.1 wants ``1.0e-5`` and reads ``1e-5`` as a string), and dates stay strings (so
``run.name=2024-05-01`` is a name, not a ``datetime.date``). Duplicate keys are errors (PyYAML
silently keeps the last one), and so are non-string keys (a bare ``on:`` or ``yes:`` is a boolean).
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Sequence
from os import PathLike
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrl.config.schema import Config

Loc = tuple[Any, ...]  # a location in the config tree: section/field names, list indices


class InputError(Exception):
    """Bad input found when a run starts or resumes, named by its key, file or run folder: a
    missing model, an unreadable task file, a checkpoint that cannot be resumed. The CLI prints
    ``error: <message>`` and exits 2; Python callers catch it like any other exception."""


class ConfigError(InputError):
    """A config that cannot be loaded; ``key``: the dotted key at fault, ``file``: the YAML file."""

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.file = file
        self.line = line


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats (``1e-5``) and without implicit timestamps."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_config(path: str | PathLike[str] | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read ``path`` (None = all defaults), apply ``KEY=VALUE`` overrides in order, validate."""
    file = None if path is None else str(path)
    data, lines = _read(file) if file is not None else ({}, {})
    sources: dict[Loc, str] = {}  # location -> the override that set it
    for text in overrides:
        _apply_override(data, text, file, lines, sources)
    _fill_empty_sections(data, Config)
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise _explain(err, file, lines, sources) from None


def dump_config(config: Config) -> str:
    """The resolved config as YAML; ``load_config`` of this text gives back an equal config.

    With ``tasks.fresh_train`` on, ``tasks.train`` is left out: the run never reads it, and a config
    that sets both is refused (so a run's saved ``config.yaml`` loads again for ``--resume``)."""
    tree = config.model_dump(mode="json")
    if config.tasks.fresh_train:
        del tree["tasks"]["train"]
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------- reading

def _read(file: str) -> tuple[dict, dict[Loc, int]]:
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"{file}: config file not found", file=file) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{file}: cannot read config file: {err}", file=file) from None
    lines: dict[Loc, int] = {}
    loader = None
    try:
        loader = _Loader(text)  # checks for unprintable characters up front (ReaderError)
        node = loader.get_single_node()
        if node is not None:
            _index(node, (), lines, file, set())
        data = loader.construct_document(node) if node is not None else None
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        where = f"{file}:{line}" if line else file
        problem = " ".join(p for p in (err.context, err.problem) if p)
        raise ConfigError(f"{where}: YAML syntax error: {problem}", file=file, line=line) from None
    except Exception as err:  # ReaderError, bad explicit tags (`!!int x`), absurd nesting, ...
        raise ConfigError(f"{file}: invalid YAML: {err}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None:  # an empty file (or only comments): all defaults
        return {}, lines
    if not isinstance(data, dict):
        raise ConfigError(f"{file}:1: top level must be a mapping of sections, got {_show(data)}",
                          file=file, line=1)
    return data, lines


def _index(node: yaml.Node, at: Loc, lines: dict[Loc, int], file: str, seen: set[int]) -> None:
    """Record the line of every key and list item under ``node``; reject duplicate/non-str keys."""
    if id(node) in seen:  # an alias: already indexed under its anchor (and may be recursive)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = _Loader("").construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ConfigError(
                    f"{file}:{line}: {_dotted(at + (str(key),))}: keys must be strings, got "
                    f"{_show(key)} (YAML reads bare yes/no/on/off as booleans; quote the key)",
                    key=_dotted(at + (str(key),)), file=file, line=line)
            if key in keys:
                raise ConfigError(f"{file}:{line}: {_dotted(at + (key,))}: duplicate key",
                                  key=_dotted(at + (key,)), file=file, line=line)
            keys.add(key)
            lines[at + (key,)] = line
            _index(value_node, at + (key,), lines, file, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[at + (i,)] = item.start_mark.line + 1
            _index(item, at + (i,), lines, file, seen)


# -------------------------------------------------------------------------------------- overrides

def _apply_override(data: dict, text: str, file: str | None, lines: dict[Loc, int],
                    sources: dict[Loc, str]) -> None:
    """Set ``a.b.c=value`` in the raw tree; the value is YAML; a mapping merges into a mapping."""
    where = file or "<defaults>"
    shown = _clip(text)
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"{where}: override '{shown}': expected KEY=VALUE, e.g. "
                          "rollout.group_size=8", key=key or None, file=file)
    parts = tuple(key.split("."))
    if not all(p.strip() == p and p for p in parts):
        raise ConfigError(f"{where}: override '{shown}': '{_clip(key)}' is not a dotted key like "
                          "rollout.group_size", key=key, file=file)
    _check_key(parts, where, shown, file)
    try:
        value = yaml.load(raw, Loader=_Loader)
    except Exception as err:
        problem = getattr(err, "problem", None) or err
        raise ConfigError(f"{where}: {key}: cannot parse value as YAML: {problem}; set by override "
                          f"'{shown}'", key=key, file=file) from None
    parent = data
    for i, part in enumerate(parts[:-1]):
        child = parent.get(part)
        if child is None:
            child = parent[part] = {}
        elif not isinstance(child, dict):
            at = parts[: i + 1]
            line = lines.get(at) if at not in sources else None
            loc = f"{where}:{line}" if line else where
            raise ConfigError(f"{loc}: {_dotted(at)}: should be a mapping, got {_show(child)}; "
                              f"cannot apply override '{shown}'", key=_dotted(at), file=file,
                              line=line)
        parent = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(parent.get(last), dict):
        _merge(parent[last], value)
    else:
        parent[last] = value
    for at in _paths(value, parts, set()):
        sources[at] = text


def _check_key(parts: Loc, where: str, shown: str, file: str | None) -> None:
    """Refuse an override key the schema does not know, before touching the tree."""
    model: type[BaseModel] = Config
    for i, part in enumerate(parts):
        dotted = _dotted(parts[: i + 1])
        if part not in model.model_fields:
            raise ConfigError(f"{where}: {dotted}: {_unknown(part, model)}; set by override "
                              f"'{shown}'", key=dotted, file=file)
        section = _section(model, part)
        if i < len(parts) - 1 and section is None:
            raise ConfigError(f"{where}: {dotted}: is a value, not a section, so "
                              f"'{_dotted(parts)}' does not exist; set by override '{shown}'",
                              key=_dotted(parts), file=file)
        model = section  # type: ignore[assignment]


def _merge(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = value


def _paths(value: Any, at: Loc, seen: set[int]):
    """``at`` and every location below it inside ``value`` (so errors deep inside are traced)."""
    yield at
    if id(value) in seen:
        return
    if isinstance(value, dict):
        seen.add(id(value))
        for key, item in value.items():
            yield from _paths(item, at + (key,), seen)
    elif isinstance(value, list):
        seen.add(id(value))
        for i, item in enumerate(value):
            yield from _paths(item, at + (i,), seen)


def _fill_empty_sections(data: dict, model: type[BaseModel]) -> None:
    """A section left empty in YAML (``rollout:`` with every line commented out) means defaults."""
    for name in model.model_fields:
        section = _section(model, name)
        if section is None or name not in data:
            continue
        if data[name] is None and model.model_fields[name].default is not None:  # optional: null = off
            data[name] = {}
        if isinstance(data[name], dict):
            _fill_empty_sections(data[name], section)


# ---------------------------------------------------------------------------------------- errors

def _explain(err: ValidationError, file: str | None, lines: dict[Loc, int],
             sources: dict[Loc, str]) -> ConfigError:
    """One line per pydantic error, each naming the key, the file, and the line or the override."""
    found: list[tuple[int | None, str, str]] = []  # (line, key, message)
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            problem = _unknown(loc[-1], _model_at(loc[:-1]))
        elif e["type"] == "value_error":
            problem = str(e["ctx"]["error"])
            # Cross-field checks (model validators) report on their section; their messages start
            # with the offending "section.key=value", so locate that key instead.
            named = _NAMED_KEY.match(problem)
            if named:
                loc = tuple(named.group(1).split("."))
        else:
            problem = f"{e['msg']} (got {_show(e['input'])})"
        line, override = None, None
        for n in range(len(loc), 0, -1):  # the innermost location we know the origin of
            if loc[:n] in sources:
                override = sources[loc[:n]]
                break
            if loc[:n] in lines:
                line = lines[loc[:n]]
                break
        where = file or "<defaults>"
        where = f"{where}:{line}" if line else where
        tail = f"; set by override '{_clip(override)}'" if override is not None else ""
        shown = problem if named_key_message(problem, loc) else f"{_dotted(loc)}: {problem}"
        found.append((line, _dotted(loc), f"{where}: {shown}{tail}"))
    found.sort(key=lambda f: (f[0] is None, f[0] or 0))  # file order first, then overrides
    line, key, _ = found[0]
    return ConfigError("\n".join(f[2] for f in found), key=key, file=file, line=line)


_NAMED_KEY = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+)=")


def named_key_message(problem: str, loc: Loc) -> bool:
    """True when ``problem`` already starts with ``<loc>=`` (no need to repeat the key)."""
    return bool(loc) and problem.startswith(_dotted(loc) + "=")


def _section(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model class of field ``name`` when it is a sub-section (or an optional one), else None."""
    ann = model.model_fields[name].annotation
    for candidate in (ann, *typing.get_args(ann)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _model_at(loc: Loc) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Config
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = _section(model, part)
    return model


# keys renamed since an earlier release: (section model, old name) -> new name
RENAMED = {("Config", "simulators"): "tools", ("RuntimeConfig", "simulator_cpus"): "tool_actor_cpus"}


def _unknown(name: Any, model: type[BaseModel] | None) -> str:
    known = list(model.model_fields) if model is not None else []
    renamed = RENAMED.get((model.__name__ if model is not None else "", str(name)))
    if renamed:
        return f"unknown key: renamed to '{renamed}'"
    close = difflib.get_close_matches(str(name), known, n=1)
    if close:
        return f"unknown key (did you mean '{close[0]}'?)"
    return f"unknown key (known keys: {', '.join(known)})" if known else "unknown key"


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) and not isinstance(part, bool) else f".{part}"
    return out.lstrip(".")


def _show(value: Any) -> str:
    """A value as a short YAML/JSON-ish literal for messages: 1, true, null, "abc", [1, 2]."""
    try:
        text = json.dumps(value, default=repr, ensure_ascii=False)
    except Exception:  # circular (YAML aliases can be), or keys json cannot write
        text = repr(value)
    return _clip(text)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
