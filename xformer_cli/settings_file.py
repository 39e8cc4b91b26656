"""A YAML settings file read into typed dataclasses, for every config xformer reads (training
configs in ``config.py``, pipeline configs in ``pipeline/settings.py``): ``${VAR:-default}``
expanded from the environment, ``key.path=value`` overrides read as YAML, each value coerced to
its field's type, and every problem (a missing or invalid file, an unknown key with the closest
known one, a value of the wrong type) one ``XformerError`` naming the file or the key. What the
keys are and which combinations make sense is the config modules' own business."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from xformer_cli.errors import XformerError

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_UNCLOSED = re.compile(r"\$\{[A-Za-z_]")


def _expand_env(text: str, key: str) -> str:
    def repl(m: re.Match) -> str:
        value = os.environ.get(m.group(1))
        if not value and m.group(2) is not None:  # the shell's :- takes the default for an empty variable too
            value = m.group(2)
        if value is None:
            raise XformerError(f"config key '{key}': environment variable {m.group(1)} is not set")
        return value

    expanded = _ENV.sub(repl, text)
    if _UNCLOSED.search(_ENV.sub("", text)):  # "${HOME/runs": a typo, not a folder named "${HOME"
        raise XformerError(f"config key '{key}': {text!r} opens a ${{VAR}} it does not close")
    return expanded


def _coerce(value: Any, tp: Any, key: str) -> Any:
    if tp is Any:  # a value handed on as it is (the pipeline's overrides, checked where they apply)
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X], or one of several types (the first that takes the value)
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(arms) < len(typing.get_args(tp)):
            return None
        for arm in arms:
            try:
                return _coerce(value, arm, key)
            except XformerError:
                continue
        names = [repr(c) for a in arms for c in typing.get_args(a)] if len(arms) > 1 else []
        if not names:
            return _coerce(value, arms[0], key)  # its own message
        kinds = [a.__name__ for a in arms if typing.get_origin(a) is not Literal] + names
        raise XformerError(f"config key '{key}': expected {' or '.join(kinds)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        raise XformerError(f"config key '{key}': expected {' or '.join(map(repr, choices))}, got {value!r}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value]  # a single item stands for a list of one
        return [_coerce(item, inner, f"{key}[{i}]") for i, item in enumerate(items)]
    if origin is dict:
        key_type, value_type = typing.get_args(tp)
        if not isinstance(value, dict):
            raise XformerError(f"config key '{key}': expected a mapping, got {value!r}")
        return {_coerce(k, key_type, key): _coerce(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(value, str) and hasattr(tp, "from_text"):
        return tp.from_text(value, key)  # a short form: data.pairs: [en-de]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise XformerError(f"config key '{key}': expected a mapping of keys, got {value!r}")
        return _build(tp, value, key + ".")
    return _coerce_scalar(value, tp, key)


def _coerce_scalar(value: Any, tp: Any, key: str) -> Any:
    """A bool, int, float or str value of a config key (``${VAR}`` expanded in a str)."""
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):  # a mapping's key set by --set
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return _expand_env(str(value), key)
        if isinstance(value, bool):  # YAML 1.1: no, yes, on, off unquoted (Norwegian's code is no)
            raise XformerError(f"config key '{key}': expected str, got {value!r} (YAML reads no, yes, on and off "
                               "unquoted as true or false: quote the text, e.g. 'no')")
    raise XformerError(f"config key '{key}': expected {tp.__name__}, got {value!r}")


def _build(cls: type, values: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise XformerError(f"unknown config key '{prefix}{key}'{hint}")
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise XformerError(f"override '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'model.d_model=256' -> ('model.d_model', 256); the value is read as YAML."""
    if "=" not in text:
        raise XformerError(f"override '{text}' must look like key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value



def apply_overrides(tree: dict, overrides: list[str]) -> set[str]:
    """``key.path=value`` overrides (values read as YAML) set in ``tree``; returns the keys set."""
    overridden = set()
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
        overridden.add(key)
    return overridden


def build_section(cls: type, values: dict, prefix: str = "") -> Any:
    """A config dataclass from a mapping: types coerced, ${ENV:-default} expanded, an unknown
    or mistyped key named in one line (what every config file of xformer gets)."""
    return _build(cls, values, prefix)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last:
    a setting the user wrote would be ignored without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base": keys given beside it override it
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice (first on line {seen[key] + 1})", key_node.start_mark)
            if isinstance(key, typing.Hashable):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_tree(path: str | Path) -> dict:
    """A YAML config file as a mapping; a missing, unreadable or non-mapping file in one line."""
    path = Path(path)
    if path.is_dir() or not path.exists():  # a pipe (-c <(...), /dev/stdin) is read as a file is
        raise XformerError(f"config file {path} is a directory" if path.is_dir() else f"config file not found: {path}")
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except OSError as exc:
        raise XformerError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)  # where the parser gave up (0-based)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise XformerError(f"config file {where} is not valid YAML: {problem}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise XformerError(f"config file {path} must hold a mapping of sections")
    return loaded


def dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    """'model.d_model', 'train.lr', ... for every leaf of a config tree (a list is a leaf)."""
    keys = []
    for key, value in tree.items():
        if isinstance(value, dict):
            keys.extend(dotted_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def merge_trees(a: dict, b: dict) -> dict:
    """``b`` laid over ``a``, section by section."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge_trees(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out



def require(ok: bool, key: str, why: str) -> None:
    """A check of one config key: when not ``ok``, one line naming the key and why."""
    if not ok:
        raise XformerError(f"config key '{key}': {why}")
