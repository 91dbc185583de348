"""PromQL label selectors: the one check shared by the API and the Prometheus source.

``spec.metrics.prometheus.selector`` is checked when a SpecTuning is parsed (``api/``), and
the Prometheus source (``metrics/prometheus.py``) checks whatever it is given before the
first query, with the same function, so a selector cannot pass one and fail the other.
Pure: the standard library only.
"""

from __future__ import annotations

import re

from spectune.errors import InputError

__all__ = ["validate_selector"]

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
