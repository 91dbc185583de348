"""PromQL label selectors and a Prometheus connection's extra headers: the checks shared by
the API and the Prometheus source.

``spec.metrics.prometheus.selector`` (and ``headers``, ``clusterLabel``) are checked when a
SpecTuning is parsed (``api/``), and the Prometheus source (``metrics/prometheus.py``) and the
CLI check whatever they are given before the first query, with the same functions, so a
value cannot pass one and fail the other. Pure: the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from spectune.errors import InputError

__all__ = [
    "HEADER_NAME_PATTERN",
    "LABEL_NAME_PATTERN",
    "MAX_HEADER_VALUE",
    "RESERVED_HEADERS",
    "check_headers",
    "check_label_name",
    "validate_selector",
]

LABEL_NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
"""A Prometheus label name (the data model's rule)."""

#: Header names spectune sets itself or that frame the request; never "extra".
RESERVED_HEADERS = frozenset(
    {"authorization", "host", "content-length", "content-type", "transfer-encoding",
     "connection", "cookie"}
)  # fmt: skip
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$"
"""An HTTP header name: an RFC 9110 token (at most 128 characters)."""
MAX_HEADER_VALUE = 4096

_MATCHER = re.compile(r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def validate_selector(selector: str) -> str:
    """Check a label selector such as ``{namespace="x",pod=~"llama-.*"}``; return its body.

    Raises :class:`~spectune.errors.InputError` naming the problem.
    """
    text = selector.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise InputError(
            f"selector {selector!r} must be label matchers in braces, e.g. "
            '\'{namespace="llm",pod=~"llama-.*"}\''
        )
    body = text[1:-1].strip()
    if not body:
        raise InputError('the selector is empty; name at least one label, e.g. {namespace="llm"}')
    parts = _split_matchers(body)
    for part in parts:
        if not _MATCHER.fullmatch(part):
            raise InputError(f'selector matcher {part.strip()!r} is not of the form label="value"')
    return body


def check_label_name(label: str, field: str) -> str:
    """A Prometheus label name, or :class:`~spectune.errors.InputError` naming ``field``."""
    if not re.match(LABEL_NAME_PATTERN, label):
        raise InputError(
            f"{field}: {label!r} is not a Prometheus label name (letters, digits and _, not "
            "starting with a digit), e.g. cluster"
        )
    return label


def check_headers(headers: Mapping[str, str], field: str) -> dict[str, str]:
    """Extra HTTP headers, checked: RFC 9110 token names, one-line printable values.

    ``Authorization`` comes from a Secret (``authSecretRef``), never from plain text (a
    SpecTuning is read by whoever may read it), and the framing headers are the HTTP
    client's; naming one is bad input.

    >>> check_headers({"X-Scope-OrgID": "tenant-a"}, "--header")
    {'X-Scope-OrgID': 'tenant-a'}
    """
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not re.match(HEADER_NAME_PATTERN, name):
            raise InputError(f"{field}: {name!r} is not an HTTP header name")
        if name.lower() in RESERVED_HEADERS:
            hint = (
                " (credentials come from authSecretRef)" if name.lower() == "authorization" else ""
            )
            raise InputError(f"{field}: the {name} header cannot be set here{hint}")
        if not value.isprintable() or len(value) > MAX_HEADER_VALUE:
            raise InputError(
                f"{field}: the value of {name} must be one printable line of at most "
                f"{MAX_HEADER_VALUE} characters"
            )
        out[name] = value
    return out


def _split_matchers(body: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    in_quotes = escaped = False
    for ch in body:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "," and not in_quotes:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current))
    return parts
