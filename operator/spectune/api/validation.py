"""What every SpecTuning model shares: the base model, the checked string types, the errors.

The spec and status models (``api/spec.py``, ``api/status.py``) derive from :class:`ApiModel`
and use :data:`Duration`, :data:`HttpUrl` and :func:`field_error`; :func:`validate_body` is
the one place where a mapping becomes a model, so :func:`~spectune.api.spec.parse_spec` and
:func:`~spectune.api.status.parse_status` report errors the same way: one
:class:`InvalidSpecError` (a :class:`~spectune.errors.SpecError`) naming every bad field path
as the API server would (``spec.drafters[1].model: required for method eagle3``).

Validation is strict and goes through JSON, so a value the API server would refuse (the
string ``"8"`` for an integer, ``"yes"`` for a boolean) is refused here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from spectune.durations import parse_duration
from spectune.errors import InputError, SpecError
from spectune.selectors import validate_selector

__all__ = [
    "DURATION_PATTERN",
    "HTTP_URL_PATTERN",
    "ApiModel",
    "Duration",
    "FieldProblem",
    "HttpUrl",
    "InvalidSpecError",
    "PromSelector",
    "field_error",
    "validate_body",
]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$"
"""Go-style durations with a day unit, as :func:`~spectune.durations.parse_duration` reads."""
HTTP_URL_PATTERN = r"^https?://[^\s/?#]+([/?#]\S*)?$"
"""An absolute http(s) URL with a host."""
_SELECTOR_PATTERN = r"^\{.*\}$"

_DURATION_RE = re.compile(DURATION_PATTERN)
_HTTP_URL_RE = re.compile(HTTP_URL_PATTERN)
_SELECTOR_RE = re.compile(_SELECTOR_PATTERN)

# The error type of a cross-field check; its context names the field below the model.
_FIELD_ERROR = "spectune_field"

M = TypeVar("M", bound=BaseModel)


class ApiModel(BaseModel):
    """Base of the SpecTuning models: camelCase JSON names, frozen, strict, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )


def _check_duration(value: str) -> str:
    if not _DURATION_RE.match(value):
        raise ValueError(f"{value!r} is not a duration; write e.g. 90s, 5m or 1h30m")
    try:
        parse_duration(value)
    except InputError:
        raise ValueError(f"{value!r} is not a positive duration") from None
    return value


def _check_url(value: str) -> str:
    if not _HTTP_URL_RE.match(value):
        raise ValueError(
            f"{value!r} is not an http(s) URL; write e.g. http://prometheus.monitoring:9090"
        )
    try:
        urlsplit(value).port  # noqa: B018 - raises on a port outside 0..65535
    except ValueError:
        raise ValueError(f"{value!r} has a port outside 1..65535") from None
    return value


def _check_selector(value: str) -> str:
    if not _SELECTOR_RE.match(value.strip()):
        raise ValueError(
            f"{value!r} is not a label selector; write label matchers in braces, e.g. "
            f'{{namespace="llm",pod=~"llama-.*"}}'
        )
    try:
        validate_selector(value)  # the Prometheus source's own check: each matcher quoted
    except InputError as exc:
        raise ValueError(str(exc)) from None
    return value


Duration = Annotated[
    str,
    AfterValidator(_check_duration),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
            "x-kubernetes-validations": [
                # A duration is positive exactly when one of its digits is not zero.
                {"rule": "self.matches('[1-9]')", "message": "must be a positive duration"}
            ],
        }
    ),
]
"""A positive duration string such as ``90s``, ``5m``, ``1h30m`` or ``7d``."""

HttpUrl = Annotated[
    str,
    AfterValidator(_check_url),
    WithJsonSchema({"type": "string", "pattern": HTTP_URL_PATTERN, "maxLength": 2048}),
]
"""An absolute ``http://`` or ``https://`` URL (kept as written, not normalised)."""

PromSelector = Annotated[
    str,
    AfterValidator(_check_selector),
    WithJsonSchema({"type": "string", "pattern": _SELECTOR_PATTERN, "maxLength": 1024}),
]
"""PromQL label matchers in braces, e.g. ``{namespace="llm",pod=~"llama-.*"}``."""


def field_error(field: str, reason: str) -> PydanticCustomError:
    """An error for a cross-field check, reported at ``<model path>.<field>``.

    Raise it from a model validator; ``field`` is relative to the model (``"model"``,
    ``"drafters[2].name"``) or empty for the model itself.
    """
    return PydanticCustomError(_FIELD_ERROR, "{reason}", {"field": field, "reason": reason})


@dataclass(frozen=True)
class FieldProblem:
    """One bad field: its path from the resource root and what is wrong with it."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class InvalidSpecError(SpecError):
    """A SpecTuning that does not validate; :attr:`problems` lists every bad field."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid SpecTuning: " + "; ".join(str(p) for p in self.problems))

    @property
    def fields(self) -> tuple[str, ...]:
        """The bad field paths, in the order they were found."""
        return tuple(p.path for p in self.problems)


def _join(root: str, loc: Sequence[int | str]) -> str:
    out = root
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("["):
            out += part
        else:
            out = f"{out}.{part}" if out else part
    return out


def _problem(root: str, err: Mapping[str, Any]) -> FieldProblem:
    loc: list[int | str] = list(err["loc"])
    kind = err["type"]
    msg = str(err["msg"])
    if kind == _FIELD_ERROR:
        ctx = err["ctx"]
        if ctx["field"]:
            loc.append(str(ctx["field"]))
        msg = str(ctx["reason"])
    elif kind == "missing":
        msg = "required"
    elif kind == "extra_forbidden":
        msg = "unknown field; check its spelling against `kubectl explain spectuning.spec`"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    else:
        msg = msg[:1].lower() + msg[1:]
        value = err.get("input")
        if value is None or isinstance(value, (str, int, float)):
            msg += f" (got {json.dumps(value)})"
    return FieldProblem(_join(root, loc), msg)


def _plain(value: Any) -> Any:
    """Mappings as dicts and sequences as lists, so any mapping (kopf's ``Spec``) dumps."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validate_body(model: type[M], data: Any, root: str) -> M:
    """``data`` validated as ``model``; every problem is reported with its path under ``root``.

    Raises :class:`InvalidSpecError` listing each bad field.
    """
    try:
        text = json.dumps(_plain(data), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSpecError([FieldProblem(root, f"not a JSON value: {exc}")]) from None
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        problems = [_problem(root, e) for e in exc.errors(include_url=False)]
        raise InvalidSpecError(problems) from None
