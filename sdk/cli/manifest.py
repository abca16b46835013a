"""Deployment manifests: read the YAML, check a DeploymentSpec locally, diff two specs.

Pure apart from reading the manifest file, so `platform deploy` can refuse a bad spec before
it talks to the platform, naming the field and, for a manifest, the line. A manifest holds
the DeploymentSpec fields of docs/api.md:

    name: demo
    model: store://models/demo/
    accelerator: cpu
    engine: auto
    max_workers: 2
    defaults:
      max_tokens: 64
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Spec field -> accepted JSON types. NOTE: bool is never an int or a number here.
_INT = "an integer"
_NUMBER = "a number"
_STR = "a string"
_MAP = "a mapping"
SPEC_TYPES: dict[str, str] = {
    "name": _STR,
    "model": _STR,
    "accelerator": _STR,
    "accelerator_count": _INT,
    "engine": _STR,
    "min_workers": _INT,
    "max_workers": _INT,
    "target_concurrency": _INT,
    "scaledown_window_s": _NUMBER,
    "max_boot_s": _NUMBER,
    "cold_penalty_s": _NUMBER,
    "queue_wait_s": _NUMBER,
    "execution_timeout_s": _NUMBER,
    "defaults": _MAP,
    "tool_parser": _STR,
}
# The JobInput fields a deployment may give defaults for (the prompt is always the caller's).
DEFAULTS_TYPES: dict[str, str] = {
    "max_tokens": _INT,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "stop": "a list of strings",
}
MODEL_SCHEMES = ("store://", "s3://", "file://", "hf://")
# Seconds fields where 0 is meaningful (no keep-alive, no price on a cold start, no queueing
# for a busy worker); others > 0.
_MAY_BE_ZERO = frozenset({"scaledown_window_s", "cold_penalty_s", "queue_wait_s"})
# The engines a deployment may name (docs/api.md, "Engines").
ENGINES = ("auto", "builtin", "vllm")
# A deployment name, as the platform accepts it: lowercase letters, digits and '-'.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


# A field path shown as it is in messages; any other is quoted (an empty key, `:`, spaces).
_PLAIN_FIELD = re.compile(r"[\w\-\[\]]+(\.[\w\-\[\]]+)*")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec."""

    field: str  # dotted path: "max_workers", "defaults.max_tokens"
    message: str  # what is wrong, with what would be right
    where: str | None = None  # "deploy.yaml:4", "--max-workers", or None when unknown

    def __str__(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        plain = _PLAIN_FIELD.fullmatch(self.field) is not None
        return f"{prefix}{self.field if plain else repr(self.field)}: {self.message}"


class ManifestError(Exception):
    """The manifest or the flags do not make a valid DeploymentSpec."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Manifest:
    spec: dict[str, Any]  # the fields as written
    lines: dict[str, int]  # dotted field path -> 1-based line of its key
    path: str


def load_manifest(path: Path) -> Manifest:
    """Parse a manifest; ManifestError (with the line) for bad YAML, a non-mapping or a repeat."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ManifestError(
            [Problem("manifest", f"cannot read it: {e.strerror or e}", source)]
        ) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ManifestError(
            [Problem("manifest", f"invalid YAML: {e.problem or e}", where)]
        ) from None
    except yaml.YAMLError as e:
        raise ManifestError([Problem("manifest", f"invalid YAML: {e}", source)]) from None
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        line = f":{root.start_mark.line + 1}" if root is not None else ""
        raise ManifestError(
            [Problem("manifest", "must be a mapping of DeploymentSpec fields", source + line)]
        )
    lines: dict[str, int] = {}
    problems: list[Problem] = []
    _key_lines(root, "", lines, problems, source)
    if problems:
        raise ManifestError(problems)
    return Manifest(spec={str(k): v for k, v in data.items()}, lines=lines, path=source)


def _key_lines(
    node: yaml.MappingNode, prefix: str, lines: dict[str, int], problems: list[Problem], src: str
) -> None:
    for key_node, value_node in node.value:
        path = prefix + str(key_node.value)
        line = key_node.start_mark.line + 1
        if path in lines:
            problems.append(
                Problem(path, f"repeated (first on line {lines[path]})", f"{src}:{line}")
            )
        lines[path] = line
        if not prefix and isinstance(value_node, yaml.MappingNode):
            _key_lines(value_node, path + ".", lines, problems, src)


def check_fields(
    spec: Mapping[str, Any], where: Mapping[str, str | None] | None = None
) -> list[Problem]:
    """Unknown fields, wrong types and malformed values; `where[field]` says where it came from."""
    where = where or {}
    problems: list[Problem] = []

    def add(field: str, message: str) -> None:
        problems.append(Problem(field, message, where.get(field)))

    for field, value in spec.items():
        expected = SPEC_TYPES.get(field)
        if expected is None:
            add(field, _unknown(field, SPEC_TYPES))
        elif not _is(value, expected):
            add(field, f"must be {expected}, got {_show(value)}")
        elif field == "defaults":
            for key, default in value.items():
                path = f"defaults.{key}"
                kind = DEFAULTS_TYPES.get(str(key))
                if kind is None:
                    problems.append(
                        Problem(path, _unknown(str(key), DEFAULTS_TYPES), where.get(path))
                    )
                elif not _is(default, kind):
                    problems.append(
                        Problem(path, f"must be {kind}, got {_show(default)}", where.get(path))
                    )
        else:
            message = _check_value(field, value)
            if message:
                add(field, message)
    return problems


def check_complete(spec: Mapping[str, Any], *, creating: bool) -> list[Problem]:
    """What the whole spec must satisfy: required fields and min_workers <= max_workers."""
    problems = []
    required = ("name", "model") if creating else ("name",)
    for field in required:
        if field not in spec:
            what = "a new deployment needs it" if creating else "required"
            problems.append(Problem(field, f"missing ({what})"))
    low, high = spec.get("min_workers"), spec.get("max_workers")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        problems.append(Problem("min_workers", f"{low} is more than max_workers ({high})"))
    return problems


def check_model_uri(uri: str) -> str | None:
    """Why `uri` is not a model location we can load, or None when it is."""
    if uri.startswith("/"):
        return None
    for scheme in MODEL_SCHEMES:
        if uri.startswith(scheme):
            rest = uri[len(scheme) :]
            if scheme == "store://" and not rest:
                return "a store:// URI needs a path: store://models/demo/"
            if scheme == "s3://" and not rest.split("/", 1)[0]:
                return "an s3:// URI needs a bucket: s3://bucket/prefix/"
            if scheme == "hf://" and rest.split("@", 1)[0].count("/") != 1:
                return "an hf:// URI is hf://org/repo[@revision]"
            if scheme == "file://" and not rest.startswith("/"):
                return "a file:// URI needs an absolute path: file:///path/to/model"
            return None
    return (
        f"unsupported model location {uri!r}: use store://prefix/ (your namespace), "
        "s3://bucket/prefix/, hf://org/repo[@revision], or file:///abs/path"
    )


def diff_specs(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """Human-readable changes from `old` (None: nothing yet) to `new`, one line each."""
    if old is None:
        return [f"+ {k}: {_show(v)}" for k, v in new.items()]
    lines = []
    for key in sorted(set(old) | set(new), key=_field_order):
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            # One level down (defaults): say which default changed, not the whole mapping.
            lines += [f"{line[:2]}{key}.{line[2:]}" for line in diff_specs(before, after)]
        elif key not in new:
            lines.append(f"- {key}: {_show(before)}")
        elif key not in old:
            lines.append(f"+ {key}: {_show(after)}")
        elif before != after:
            lines.append(f"~ {key}: {_show(before)} -> {_show(after)}")
    return lines


def _field_order(field: str) -> tuple[int, str]:
    order = list(SPEC_TYPES)
    return (order.index(field) if field in order else len(order), field)


def _check_value(field: str, value: Any) -> str | None:
    if field == "name" and not _NAME_RE.fullmatch(value):
        return f"{value!r} is not a valid name (lowercase letters, digits, '-'; at most 63)"
    if field == "model":
        return check_model_uri(value)
    if field == "accelerator" and not value:
        return "must not be empty"
    if field == "engine" and value not in ENGINES:
        return f"must be one of {', '.join(ENGINES)}, got {value!r}"
    if field in ("min_workers", "max_workers") and value < 0:
        return f"must be >= 0, got {value}"
    if field in ("accelerator_count", "target_concurrency") and value < 1:
        return f"must be >= 1, got {value}"
    if field in _MAY_BE_ZERO and value < 0:
        return f"must be >= 0 seconds, got {value}"
    if field.endswith("_s") and field not in _MAY_BE_ZERO and value <= 0:
        return f"must be > 0 seconds, got {value}"
    return None


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == _STR:
        return isinstance(value, str)
    if kind == _INT:
        return isinstance(value, int)
    if kind == _NUMBER:
        return isinstance(value, int | float)
    if kind == _MAP:
        return isinstance(value, dict)
    if kind == "a list of strings":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    raise AssertionError(f"unknown kind {kind}")


def _unknown(field: str, known: Mapping[str, str]) -> str:
    close = difflib.get_close_matches(field, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field{hint}; expected one of: {', '.join(known)}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
