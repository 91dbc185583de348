"""Where a container's engine command line is, read and rewritten in place.

``k8s/deployments.py`` reads the speculative setting a target runs and writes an arm into a
canary or a promotion through :func:`engine_command` only. A container runs its engine in
one of two shapes:

* **direct**: ``command``/``args`` are the engine's own argv (``vllm serve m --port 8000``,
  or only flags when the image's entrypoint is the engine): the flags are the list itself;
* **shell-wrapped**: ``sh -c "…; exec vllm serve m --speculative-config '{…}'"`` (the
  LeaderWorkerSet recipe and many charts, in ``command`` or split over ``command`` and
  ``args``, ``bash -c``, ``-lc``, ``-ec``). The engine's flags are inside one string, so
  they are read from the one statement of the script that runs the engine, and a new
  setting is written into that statement, never appended after the script (where the
  shell would ignore it and the canary would run the incumbent).

Rewriting keeps every token it does not change byte for byte (its quoting, ``$VAR`` and
``$(…)`` expansions, line continuations); only the speculative flags are replaced, quoted
with :func:`shlex.quote`. What cannot be rewritten safely is refused with a
:class:`~spectune.errors.SpecError` naming the container: a script without an engine
command (a wrapper script file), several engine commands, or speculative flags written
with shell expansions (their value is only known to the shell).
"""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.errors import SpecError

__all__ = ["EngineCommand", "engine_command", "runs_an_engine"]

Obj = Mapping[str, Any]

_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})


_SEPARATORS = ("&&", "||", ";;", ";", "&", "|", "\n")


@dataclass(frozen=True)
class _Token:
    raw: str
    """The token as written in the script (quotes included)."""
    start: int
    end: int
    value: str
    """What the shell passes (quotes removed); the raw text for a dynamic token."""
    dynamic: bool
    """Holds a ``$`` or backtick expansion outside single quotes: only the shell knows its
    value, so it is kept as written and never rewritten."""


@dataclass(frozen=True)
class EngineCommand:
    """A container's engine command line and how to write a new one back.

    ``field`` is the container list that holds it (``args`` or ``command``); ``argv`` the
    engine's command line as the engine parses it. For a shell-wrapped engine, ``script``
    is the index in ``field`` of the script string and ``tokens`` the engine statement's
    tokens in it.
    """

    container: str
    field: str
    argv: tuple[str, ...]
    items: tuple[str, ...]
    """The current items of ``field``."""
    script: int | None = None
    tokens: tuple[_Token, ...] = ()

    def render(self, argv: Sequence[str]) -> list[str]:
        """The new items of ``field`` for the engine command line ``argv``.

        In a script, the tokens ``argv`` keeps are written as they were (with the blank
        before each, when its neighbour is kept too) and new ones quoted; the rest of the
        script is untouched.
        """
        if self.script is None:
            return list(argv)
        text = self.items[self.script]
        pieces: list[tuple[int | None, str]] = []
        matcher = difflib.SequenceMatcher(a=[t.value for t in self.tokens], b=list(argv))
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                pieces.extend((i, self.tokens[i].raw) for i in range(i1, i2))
                continue
            touched = [t for t in self.tokens[i1:i2] if t.dynamic]
            if touched:
                raise SpecError(
                    f"container {self.container!r}: its script's speculative flags use shell "
                    f"expansions ({touched[0].raw}); spectune cannot rewrite them safely: "
                    "write the speculative flags literally"
                )
            pieces.extend((None, shlex.quote(a)) for a in argv[j1:j2])
        out = []
        for n, (i, raw) in enumerate(pieces):
            if n == 0:
                out.append(raw)
            elif i is not None and pieces[n - 1][0] == i - 1:
                out.append(text[self.tokens[i - 1].end : self.tokens[i].start] + raw)
            else:
                out.append(" " + raw)
        new = text[: self.tokens[0].start] + "".join(out) + text[self.tokens[-1].end :]
        items = list(self.items)
        items[self.script] = new
        return items


_ENGINE_IMAGES = ("vllm", "sglang", "tensorrt-llm", "tensorrt_llm", "trtllm")


def runs_an_engine(container: Obj) -> bool:
    """Whether a container runs an engine: its command line (or its script) starts one, or
    its image is an engine's and its command is the image's own (flags only, or ``serve``:
    the vLLM image's entrypoint is the engine)."""
    full = [str(a) for a in (container.get("command") or [])] + [
        str(a) for a in (container.get("args") or [])
    ]
    wrap = _shell_script(full)
    if wrap is not None:
        return bool(_engine_statements(full[wrap]))
    if _engine_at(full) is not None:
        return True
    image = str(container.get("image") or "").rsplit("/", 1)[-1].split(":")[0].lower()
    return not container.get("command") and any(e in image for e in _ENGINE_IMAGES)


def engine_command(container: Obj) -> EngineCommand:
    """Where ``container`` runs its engine (module docstring); raises on a script it cannot
    read safely."""
    name = str(container.get("name"))
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    full = command + args
    at = _shell_script(full)
    if at is None:
        field, items = ("args", args) if args or not command else ("command", command)
        return EngineCommand(name, field, tuple(items), tuple(items))
    field, items, index = (
        ("command", command, at) if at < len(command) else ("args", args, at - len(command))
    )
    statements = _engine_statements(full[at])
    if not statements:
        raise SpecError(
            f"container {name!r} runs a shell script ({full[0]} -c) in which spectune finds no "
            "vllm, sglang or trtllm-serve command; it cannot read or set the speculative "
            "flags: run the engine from the container's command or args, or write its "
            "command line in the script itself"
        )
    if len(statements) > 1:
        raise SpecError(
            f"container {name!r} runs {len(statements)} engine commands in one shell script; "
            "spectune cannot tell which one serves: set spec.targetRef.container to a "
            "container that runs one"
        )
    tokens = statements[0]
    return EngineCommand(
        name, field, tuple(t.value for t in tokens), tuple(items), index, tuple(tokens)
    )


def _shell_script(full: Sequence[str]) -> int | None:
    """Index of the script in ``sh -c SCRIPT`` (also ``-lc``, ``-ec``, ``-xc``), or None."""
    if not full or os.path.basename(full[0]) not in _SHELLS:
        return None
    for i, tok in enumerate(full[1:], start=1):
        if not tok.startswith("-") or tok.startswith("--"):
            return None  # a script file (`bash run.sh`): not an inline script
        if "c" in tok[1:] and tok[1:].isalpha():
            return i + 1 if i + 1 < len(full) else None
    return None


def _engine_at(tokens: Sequence[str]) -> int | None:
    """Index where an engine command starts in ``tokens`` (after ``exec``, ``env``,
    ``VAR=value`` assignments and an interpreter's ``-m``), or None."""
    for i, tok in enumerate(tokens):
        base = os.path.basename(tok)
        if base in ("vllm", "trtllm-serve") or base.startswith("sglang"):
            return i
        if base.startswith("python") and "-m" in tokens[i + 1 : i + 3]:
            m = tokens.index("-m", i + 1)
            module = tokens[m + 1] if m + 1 < len(tokens) else ""
            if module.split(".")[0] in ("vllm", "sglang"):
                return i
        if base in ("exec", "env", "nohup", "time") or ("=" in tok and not tok.startswith("-")):
            continue
        return None
    return None


def _engine_statements(script: str) -> list[list[_Token]]:
    """The engine command of each statement of ``script`` that runs one, as tokens."""
    found = []
    for start, end in _statements(script):
        tokens = _tokens(script, start, end)
        at = _engine_at([t.value for t in tokens])
        if at is not None:
            found.append(tokens[at:])
    return found


def _scan(text: str, start: int, end: int, on_top: Callable[[int], int | None]) -> None:
    """Walk ``text[start:end]`` as a shell reads it; call ``on_top(i)`` at each character
    outside quotes and ``$(…)``/backticks; it returns how many characters it consumed."""
    i, depth, quote = start, 0, ""
    while i < end:
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\":
            if not quote and depth == 0 and text.startswith("\\\n", i):
                on_top(i)
            i += 2
            continue
        elif quote == '"':
            if ch == '"':
                quote = ""
            elif text.startswith("$(", i):
                depth += 1
                i += 2
                continue
            elif ch == ")" and depth:
                depth -= 1
        elif ch in "'\"":
            quote = ch
        elif text.startswith("$(", i):
            depth += 1
            i += 2
            continue
        elif ch == "`":
            depth = depth - 1 if depth and text[i - 1 : i] != "(" else depth + 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth == 0:
            took = on_top(i)
            if took:
                i += took
                continue
        i += 1


def _statements(script: str) -> list[tuple[int, int]]:
    """Spans of the statements of ``script`` (split at ``;``, ``&&``, ``||``, ``|``, ``&``
    and newlines outside quotes and substitutions)."""
    spans: list[tuple[int, int]] = []
    begin = 0

    def cut(i: int) -> int | None:
        nonlocal begin
        for sep in _SEPARATORS:
            if script.startswith(sep, i):
                spans.append((begin, i))
                begin = i + len(sep)
                return len(sep)
        return None

    _scan(script, 0, len(script), cut)
    spans.append((begin, len(script)))
    return [(a, b) for a, b in spans if script[a:b].strip()]


def _tokens(script: str, start: int, end: int) -> list[_Token]:
    """The words of one statement, with their spans (a backslash-newline is a space)."""
    bounds: list[int] = []

    def blank(i: int) -> int | None:
        if script[i].isspace():
            bounds.append(i)
        elif script.startswith("\\\n", i):  # a line continuation is a blank
            bounds.extend((i, i + 1))
        return None

    _scan(script, start, end, blank)
    words, begin = [], start
    for i in [*bounds, end]:
        if i > begin:
            words.append((begin, i))
        begin = i + 1
    out = []
    for a, b in words:
        raw = script[a:b]
        dynamic = _expands(raw)
        try:
            parts = shlex.split(raw)
            value = parts[0] if len(parts) == 1 else raw
        except ValueError:
            value, dynamic = raw, True
        out.append(_Token(raw, a, b, raw if dynamic else value, dynamic))
    return out


def _expands(raw: str) -> bool:
    """Whether ``raw`` holds ``$`` or a backtick outside single quotes."""
    quote = ""
    for ch in raw:
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "'" and not quote:
            quote = "'"
        elif ch == '"':
            quote = "" if quote == '"' else '"'
        elif ch in "$`":
            return True
    return False
