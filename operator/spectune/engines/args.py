"""Speculative-decoding settings on an engine's command line: read them, write them.

Neither vLLM nor SGLang changes its speculative method or k at run time; both take them
from the command line at start (``reference/engines.md`` §0, fact 6). The argv is therefore
*the* speculative configuration, and this module is the one place that knows how each
engine spells it. It turns a vLLM or SGLang argv into one engine-neutral
:class:`SpecConfig`, and writes a :class:`SpecConfig` back into an argv.

Who calls it: the operator renders the arm it chose into a Deployment's container args
(:func:`render_vllm_args`, :func:`render_sglang_args`); the simulator's server mode parses
the args it is started with, and the diagnose CLI reads the current k
(:func:`parse_vllm_args`, :func:`parse_sglang_args`).

What a render promises:

* every argument that is not a speculative setting stays, in its position and order
  (including the positional model of ``vllm serve MODEL`` and a ``python -m ...`` prefix);
* an argv that already says ``spec`` comes back unchanged, so the operator never restarts
  pods over a difference in spelling; otherwise the speculative flags are rewritten where
  the old ones stood, or appended;
* ``render(render(a, s), s) == render(a, s)`` and ``parse(render(a, s)).spec == s``.

Old spellings -- vLLM's flags from before ``--speculative-config``, deprecated method names,
abbreviated SGLang flags -- are read, rewritten by the next render, and reported in
:attr:`ParsedArgs.notes`. Anything wrong raises :class:`~spectune.errors.SpecError` with a
one-line message that names the flag or key and says what to write instead.

Pure: argv in, argv out; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.errors import SpecError

__all__ = [
    "DOCUMENTED_METHODS",
    "ParsedArgs",
    "SpecConfig",
    "parse_sglang_args",
    "parse_vllm_args",
    "render_sglang_args",
    "render_vllm_args",
    "trusts_remote_code",
]

# --------------------------------------------------------------------------------------------
# The engine-neutral speculative config (the keys of vLLM's --speculative-config)
# --------------------------------------------------------------------------------------------

_PER_BATCH_KEY = "num_speculative_tokens_per_batch_size"
_FIELD_KEYS = frozenset(
    {
        "method",
        "model",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "draft_tensor_parallel_size",
        _PER_BATCH_KEY,
    }
)
# vLLM refuses these methods without draft weights ("num_speculative_tokens was provided
# but without speculative model").
_NEEDS_MODEL = frozenset(
    {"eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash", "dspark"}
)
#: The methods vLLM's speculative-decoding docs describe today (``reference/anchors-2026.md``
#: §1.1), with their own keys beside the common ones; every other key, and any other
#: method, is kept verbatim in :attr:`SpecConfig.extra`. Parallel drafting (P-EAGLE, PARD)
#: is a key, ``parallel_drafting``, of eagle/eagle3/draft_model, not a method.
DOCUMENTED_METHODS: Mapping[str, tuple[str, ...]] = {
    "eagle": ("parallel_drafting", "disable_padded_drafter_batch", "speculative_token_tree"),
    "eagle3": ("parallel_drafting", "disable_padded_drafter_batch", "speculative_token_tree"),
    "mtp": (),
    "draft_model": ("parallel_drafting", "max_model_len", "quantization"),
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "suffix": (
        "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
    ),
    "dflash": (),
    "dspark": ("adaptive_verification",),
    "mlp_speculator": (),
}  # fmt: skip
_METHOD_PATTERN = re.compile(r"[a-z][a-z0-9_]*\Z")
_INT_PATTERN = re.compile(r"[+-]?[0-9]+\Z")
_NUMBER_PATTERN = re.compile(r"-(?:[0-9]+|[0-9]*\.[0-9]+)\Z")
_EXAMPLE_JSON = '\'{"method":"ngram","num_speculative_tokens":4}\''
_TP_HINT = (
    "tensor_parallel_size is not a speculative-config key (vLLM rejects it); "
    "use draft_tensor_parallel_size"
)


@dataclass(frozen=True, eq=False)
class SpecConfig:
    """One speculative-decoding setting, in vLLM's ``--speculative-config`` vocabulary.

    The fields are the keys the operator reasons about; every other key lives in
    :attr:`extra`, kept verbatim so that a render never drops a user's setting. Two configs
    are equal when their :meth:`to_json` texts are equal, and hash the same way, so a config
    can key a dict even when :attr:`extra` holds lists or objects.

    Parameters
    ----------
    method
        vLLM method name, lowercase: ``eagle``, ``eagle3``, ``mtp``, ``draft_model``,
        ``ngram``, ``suffix``, ``medusa``, ... Deprecated model-specific MTP names
        (``deepseek_mtp``) are refused here; the parsers read them as ``mtp``.
    num_speculative_tokens
        k, the tokens drafted per step; at least 1.
    model
        Draft model, EAGLE head or extra weights; ``None`` for ``ngram``, ``suffix``, ``mtp``.
    prompt_lookup_min, prompt_lookup_max
        n-gram match window, each at least 1, min not above max.
    draft_tensor_parallel_size
        Tensor-parallel size of the drafter; at least 1.
    per_batch_size
        vLLM's Dynamic SD schedule ``num_speculative_tokens_per_batch_size``: entries
        ``(start_bs, end_bs, k)`` with ``1 <= start_bs <= end_bs``, ranges ascending and
        not overlapping, and ``0 <= k <= num_speculative_tokens``. ``None`` = no schedule.
    extra
        Every other key as ``(key, value)`` pairs with JSON values; stored sorted by key,
        with each value as JSON reads it back (tuples become lists).
    """

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_tensor_parallel_size: int | None = None
    per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not _METHOD_PATTERN.match(self.method):
            raise SpecError(
                f"method must be a lowercase vLLM method name such as 'eagle3' or 'ngram', "
                f"got {self.method!r}"
            )
        if self.method.endswith("_mtp"):
            raise SpecError(
                f"method {self.method!r} is a deprecated model-specific MTP name; use 'mtp'"
            )
        _require_int("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise SpecError(f"model must be a non-empty string or null, got {_show(self.model)}")
        if self.method in _NEEDS_MODEL and self.model is None:
            raise SpecError(
                f"method {self.method!r} needs draft weights; set model to the draft model or head"
            )
        for key in ("prompt_lookup_min", "prompt_lookup_max", "draft_tensor_parallel_size"):
            value = getattr(self, key)
            if value is not None:
                _require_int(key, value, minimum=1)
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise SpecError(
                f"prompt_lookup_min ({low}) is above prompt_lookup_max ({high}); swap them"
            )
        if self.per_batch_size is not None:
            schedule = _check_schedule(self.per_batch_size, self.num_speculative_tokens)
            object.__setattr__(self, "per_batch_size", schedule)
        object.__setattr__(self, "extra", _check_extra(self.extra))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SpecConfig):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def to_json(self) -> str:
        """Return the ``--speculative-config`` JSON: sorted keys, no spaces, no null keys."""
        return json.dumps(self._mapping(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SpecConfig:
        """Read a ``--speculative-config`` JSON object, inferring ``method`` as vLLM does.

        A deprecated MTP method name is read as ``mtp``; use :func:`parse_vllm_args` to be
        told about such rewrites.
        """
        return _decode_config(text, "speculative config")[0]

    def _mapping(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        data["method"] = self.method
        data["num_speculative_tokens"] = self.num_speculative_tokens
        optional = {
            "model": self.model,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
            "draft_tensor_parallel_size": self.draft_tensor_parallel_size,
        }
        data.update({key: value for key, value in optional.items() if value is not None})
        if self.per_batch_size is not None:
            data[_PER_BATCH_KEY] = [list(entry) for entry in self.per_batch_size]
        return data


@dataclass(frozen=True)
class ParsedArgs:
    """What an engine's argv says about speculation.

    Attributes
    ----------
    spec
        The speculative config, or ``None`` when the engine runs without speculation.
    notes
        Human-readable notes on what was read in an old or indirect form and will be
        rewritten by the next render, e.g. ``"legacy --speculative-model/--num-speculative-tokens
        migrated into --speculative-config"``.
    """

    spec: SpecConfig | None
    notes: tuple[str, ...] = ()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object) -> str:
    try:
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        return repr(value)


def _require_int(key: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{key} must be an integer >= {minimum}, got {_show(value)}")


def _check_schedule(entries: object, k: int) -> tuple[tuple[int, int, int], ...]:
    key = _PER_BATCH_KEY
    if isinstance(entries, str | bytes | Mapping) or not isinstance(entries, Iterable):
        raise SpecError(f"{key} must be a list of [start_bs, end_bs, k], got {_show(entries)}")
    rows: list[tuple[int, int, int]] = []
    for number, entry in enumerate(entries, 1):
        if (
            isinstance(entry, str | bytes)
            or not isinstance(entry, Sequence)
            or len(entry) != 3
            or not all(_is_int(item) for item in entry)
        ):
            raise SpecError(
                f"{key}: entry {number} must be [start_bs, end_bs, k] integers, got {_show(entry)}"
            )
        start, end, depth = int(entry[0]), int(entry[1]), int(entry[2])
        row = (start, end, depth)
        if start < 1 or end < start:
            raise SpecError(f"{key}: entry {_show(row)} needs 1 <= start_bs <= end_bs")
        if not 0 <= depth <= k:
            raise SpecError(
                f"{key}: entry {_show(row)} drafts {depth} tokens; keep it between 0 and "
                f"num_speculative_tokens ({k})"
            )
        if rows and start <= rows[-1][1]:
            raise SpecError(
                f"{key}: entry {_show(row)} overlaps or comes before {_show(rows[-1])}; "
                f"list the batch-size ranges in ascending order without overlap"
            )
        rows.append(row)
    if not rows:
        raise SpecError(f"{key} is empty; give [[start_bs, end_bs, k], ...] or leave it out")
    return tuple(rows)


def _check_extra(items: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    seen: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise SpecError(f"extra must hold (key, value) pairs, got {item!r}")
        key, value = item
        if not isinstance(key, str) or not key:
            raise SpecError(f"extra keys must be non-empty strings, got {key!r}")
        if key in _FIELD_KEYS:
            raise SpecError(f"extra key {key!r} is a SpecConfig field; set the field instead")
        if key == "tensor_parallel_size":
            raise SpecError(_TP_HINT)
        if key in seen:
            raise SpecError(f"extra key {key!r} is given twice; keep one")
        try:
            text = json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError):
            raise SpecError(
                f"extra key {key!r} holds {value!r}, which is not JSON; use strings, "
                f"numbers, booleans, lists or objects"
            ) from None
        seen[key] = json.loads(text)
    return tuple(sorted(seen.items()))


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{where}: malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"pass one JSON object such as {_EXAMPLE_JSON}"
        ) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{where}: expected a JSON object such as {_EXAMPLE_JSON}, got {_show(data)}"
        )
    return data


def _decode_config(text: str, where: str) -> tuple[SpecConfig, list[str]]:
    return _config_from_mapping(_json_object(text, where), where)


def _infer_method(model: str | None, where: str) -> str:
    # vLLM's SpeculativeConfig: "[ngram]" selects n-gram; a model name with "eagle3" or
    # "eagle-" selects EAGLE; Medusa and MLP speculators are told by their HF model type,
    # which only the name can stand in for here; anything else is a draft model.
    if model is None:
        raise SpecError(
            f'{where}: neither method nor model is set; set method (e.g. "ngram", "mtp") or model'
        )
    if model in ("ngram", "[ngram]"):
        return "ngram"
    name = model.lower()
    if "eagle3" in name:
        return "eagle3"
    if "eagle" in name:
        return "eagle"
    if "medusa" in name:
        return "medusa"
    return "draft_model"


def _config_from_mapping(source: Mapping[str, Any], where: str) -> tuple[SpecConfig, list[str]]:
    data = dict(source)
    notes: list[str] = []
    if "tensor_parallel_size" in data:
        raise SpecError(f"{where}: {_TP_HINT}")
    model = data.pop("model", None)
    if model is not None and (not isinstance(model, str) or not model):
        raise SpecError(f"{where}: model must be a non-empty string, got {_show(model)}")
    raw = data.pop("method", None)
    if raw is None:
        method = _infer_method(model, where)
        notes.append(
            f"{where}: no method given; inferred {method!r} from model {model!r} as vLLM does "
            f"(render writes it out)"
        )
        if method == "ngram":
            model = None  # vLLM's "[ngram]" model stands for the method, not for weights
    elif not isinstance(raw, str) or not raw:
        raise SpecError(f"{where}: method must be a non-empty string, got {_show(raw)}")
    elif raw == "[ngram]":
        method = "ngram"
        notes.append(f"{where}: method '[ngram]' read as 'ngram' (render writes 'ngram')")
    elif raw.endswith("_mtp") and _METHOD_PATTERN.match(raw):
        method = "mtp"
        notes.append(f"{where}: method {raw!r} is deprecated in vLLM; read as 'mtp'")
    else:
        method = raw
    k = data.pop("num_speculative_tokens", None)
    if k is None:
        raise SpecError(f"{where}: num_speculative_tokens is missing; set it to k >= 1")
    schedule = data.pop(_PER_BATCH_KEY, None)
    lookup_min = data.pop("prompt_lookup_min", None)
    lookup_max = data.pop("prompt_lookup_max", None)
    draft_tp = data.pop("draft_tensor_parallel_size", None)
    try:
        spec = SpecConfig(
            method=method,
            num_speculative_tokens=k,
            model=model,
            prompt_lookup_min=lookup_min,
            prompt_lookup_max=lookup_max,
            draft_tensor_parallel_size=draft_tp,
            per_batch_size=schedule,
            extra=tuple(data.items()),
        )
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    return spec, notes


# --------------------------------------------------------------------------------------------
# Finding flags in an argv
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hit:
    """One occurrence of a speculative flag: ``argv[start:stop]``."""

    start: int
    stop: int
    flag: str  # the canonical name
    spelled: str  # the name as written, before any "="
    value: str | None  # None: no value given
    inline: bool  # written as --flag=value


def _options_end(argv: Sequence[str]) -> int:
    # argparse reads everything after a bare "--" as positional.
    return argv.index("--") if "--" in argv else len(argv)


def _looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NUMBER_PATTERN.match(token)


def _scan(argv: Sequence[str], resolve: Callable[[str], str | None]) -> list[_Hit]:
    """Find the flags ``resolve`` names; each takes one value, as ``--f v`` or ``--f=v``."""
    hits: list[_Hit] = []
    end = _options_end(argv)
    index = 0
    while index < end:
        token = argv[index]
        if not _looks_like_option(token):
            index += 1
            continue
        name, equals, inline_value = token.partition("=")
        flag = resolve(name)
        if flag is None:
            index += 1
        elif equals:
            hits.append(_Hit(index, index + 1, flag, name, inline_value or None, True))
            index += 1
        elif index + 1 < end and not _looks_like_option(argv[index + 1]):
            value = argv[index + 1] or None
            hits.append(_Hit(index, index + 2, flag, name, value, False))
            index += 2
        else:
            hits.append(_Hit(index, index + 1, flag, name, None, False))
            index += 1
    return hits


def _check_hits(hits: Sequence[_Hit], examples: Mapping[str, str]) -> None:
    """Refuse a flag without a value, and a setting given twice (argparse keeps the last)."""
    first: dict[str, _Hit] = {}
    for hit in hits:
        if hit.value is None:
            example = examples.get(hit.flag, "VALUE")
            raise SpecError(f"{hit.spelled} has no value; give one, e.g. {hit.spelled} {example}")
        if hit.flag in first:
            earlier = first[hit.flag].spelled
            both = hit.spelled if earlier == hit.spelled else f"{earlier} and {hit.spelled}"
            raise SpecError(f"{both}: {hit.flag} is given twice; keep one")
        first[hit.flag] = hit


def _int_value(text: str, flag: str, *, minimum: int) -> int:
    if not _INT_PATTERN.match(text.strip()):
        raise SpecError(f"{flag} must be an integer, got {text!r}")
    value = int(text)
    if value < minimum:
        raise SpecError(f"{flag} must be >= {minimum}, got {value}")
    return value


_TRUST_FLAGS = {"--trust-remote-code": True, "--no-trust-remote-code": False}
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def trusts_remote_code(argv: Sequence[str]) -> bool:
    """Whether an engine started with ``argv`` may run code shipped with a model repository.

    vLLM and SGLang both read ``--trust-remote-code`` (vLLM also its ``--no-`` form and the
    underscore spelling), and a drafter's checkpoint is loaded with the target's setting, so
    a drafter ``model`` then names code the engine runs. The last flag wins, as argparse
    reads it. A ``--config`` file is not read here: its contents are unknown, so an argv with
    one counts as trusting (the check fails closed).

    >>> trusts_remote_code(["serve", "m", "--trust-remote-code"])
    True
    >>> trusts_remote_code(["serve", "m", "--trust_remote_code", "--no-trust-remote-code"])
    False
    """
    trusted = False
    for token in argv[: _options_end(argv)]:
        name, equals, value = token.partition("=")
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        if name == "--config":
            trusted = True
        elif name in _TRUST_FLAGS:
            trusted = _TRUST_FLAGS[name] and not (equals and value.lower() in _FALSE_WORDS)
    return trusted


def _edit(argv: Sequence[str], drop: set[int], insert: Mapping[int, list[str]]) -> list[str]:
    """Drop the indices in ``drop``; put ``insert[i]`` before index ``i`` (``len`` = the end)."""
    out: list[str] = []
    for index, token in enumerate(argv):
        out.extend(insert.get(index, ()))
        if index not in drop:
            out.append(token)
    out.extend(insert.get(len(argv), ()))
    return out


# --------------------------------------------------------------------------------------------
# vLLM (reference/engines.md §1.7)
# --------------------------------------------------------------------------------------------

_VLLM_CONFIG = "--speculative-config"
# Flags from before --speculative-config, each one key of it.
_VLLM_LEGACY = {
    "--speculative-model": "model",
    "--num-speculative-tokens": "num_speculative_tokens",
    "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--speculative-model-quantization": "quantization",
    "--speculative-max-model-len": "max_model_len",
}
# Newer shorthands for single keys, which may stand beside --speculative-config.
_VLLM_SHORTHAND = {
    "--spec-method": "method",
    "--spec-model": "model",
    "--spec-tokens": "num_speculative_tokens",
}
_VLLM_KEYS = {**_VLLM_LEGACY, **_VLLM_SHORTHAND}
_VLLM_SHORT_NAMES = {
    "-sc": _VLLM_CONFIG,
    "-spec-draft-tp": "--speculative-draft-tensor-parallel-size",
}
_VLLM_FLAGS = frozenset({_VLLM_CONFIG, *_VLLM_LEGACY, *_VLLM_SHORTHAND})
_VLLM_INT_KEYS = frozenset(
    {
        "num_speculative_tokens",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "draft_tensor_parallel_size",
        "max_model_len",
    }
)
_VLLM_EXAMPLES = {
    _VLLM_CONFIG: _EXAMPLE_JSON,
    "--speculative-model": "'[ngram]'",
    "--num-speculative-tokens": "4",
    "--ngram-prompt-lookup-max": "5",
    "--ngram-prompt-lookup-min": "2",
    "--speculative-draft-tensor-parallel-size": "1",
    "--speculative-model-quantization": "fp8",
    "--speculative-max-model-len": "4096",
    "--spec-method": "ngram",
    "--spec-model": "MODEL",
    "--spec-tokens": "4",
}


def _resolve_vllm(name: str) -> str | None:
    if name.startswith("--"):
        # vLLM's FlexibleArgumentParser reads "_" as "-" in a flag name up to the first ".",
        # and "--speculative-config.KEY VALUE" as one key of the JSON.
        base, dot, path = name[2:].partition(".")
        flag = "--" + base.replace("_", "-")
        if dot:
            return f"{flag}.{path}" if flag == _VLLM_CONFIG else None
        return flag if flag in _VLLM_FLAGS else None
    return _VLLM_SHORT_NAMES.get(name)


def _dotted_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _read_vllm(argv: Sequence[str], hits: Sequence[_Hit]) -> tuple[ParsedArgs, bool]:
    """Parse the hits; the flag says whether the argv is already in the form render writes."""
    notes: list[str] = []
    options = argv[: _options_end(argv)]
    if any(token == "--config" or token.startswith("--config=") for token in options):
        notes.append(
            "--config FILE is not read here; a speculative-config inside it is not seen "
            "(flags on the command line take precedence over it)"
        )
    if not hits:
        return ParsedArgs(None, tuple(notes)), True
    _check_hits(hits, _VLLM_EXAMPLES)
    config = [hit for hit in hits if hit.flag == _VLLM_CONFIG]
    dotted = [hit for hit in hits if hit.flag.startswith(_VLLM_CONFIG + ".")]
    legacy = [hit for hit in hits if hit.flag in _VLLM_LEGACY]
    shorthand = [hit for hit in hits if hit.flag in _VLLM_SHORTHAND]
    if config and legacy:
        old = legacy[0]
        raise SpecError(
            f"{config[0].spelled} and legacy {old.spelled} are both given; move {old.spelled} "
            f"into the JSON as {_VLLM_LEGACY[old.flag]!r}"
        )
    if config and dotted:
        raise SpecError(
            f"{config[0].spelled} and {dotted[0].spelled} are both given, and vLLM would keep "
            f"only the dotted keys; put every key into the {config[0].spelled} JSON"
        )

    data: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if config:
        where = config[0].spelled
        assert config[0].value is not None  # _check_hits refused a missing value
        data = _json_object(config[0].value, where)
        origin = dict.fromkeys(data, where)
    else:
        where = "/".join(dict.fromkeys(hit.flag.split(".")[0] for hit in hits))
    for hit in dotted:
        path = hit.flag[len(_VLLM_CONFIG) + 1 :].split(".")
        if "" in path or path[-1].endswith("+"):
            raise SpecError(
                f"{hit.spelled} is not a key path this reads; write the setting into "
                f"{_VLLM_CONFIG} JSON"
            )
        assert hit.value is not None
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"{hit.spelled}: {part!r} is set to a value, not an object")
            node = child
        node[path[-1]] = _dotted_value(hit.value)
    for hit in [*legacy, *shorthand]:
        key = _VLLM_KEYS[hit.flag]
        assert hit.value is not None
        if key in origin:
            raise SpecError(
                f"{hit.spelled} sets {key!r}, which {origin[key]} already sets; keep one"
            )
        origin[key] = hit.spelled
        data[key] = (
            _int_value(hit.value, hit.spelled, minimum=1) if key in _VLLM_INT_KEYS else hit.value
        )
    if legacy and "model" not in data:
        raise SpecError(
            f"{legacy[0].spelled} needs --speculative-model (a draft model, or '[ngram]'); "
            f"add it, or write {_VLLM_CONFIG} instead"
        )
    if legacy and "num_speculative_tokens" not in data:
        raise SpecError(
            "--speculative-model needs --num-speculative-tokens; add it, "
            "e.g. --num-speculative-tokens 4"
        )
    spec, decoded_notes = _config_from_mapping(data, where)
    notes.extend(decoded_notes)
    migrated = [*legacy, *shorthand, *dotted]
    if migrated:
        names = "/".join(dict.fromkeys(hit.flag for hit in migrated))
        kind = "legacy " if legacy else ""
        notes.append(f"{kind}{names} migrated into {_VLLM_CONFIG}")
    clean = len(hits) == 1 and bool(config) and not decoded_notes
    return ParsedArgs(spec, tuple(notes)), clean


def parse_vllm_args(argv: Sequence[str]) -> ParsedArgs:
    """Read the speculative config from a vLLM command line.

    Reads ``--speculative-config`` (also ``-sc``, ``--speculative_config``, dotted
    ``--speculative-config.KEY VALUE``), the legacy flags ``--speculative-model`` (including
    ``"[ngram]"``), ``--num-speculative-tokens``, ``--ngram-prompt-lookup-max/-min``,
    ``--speculative-draft-tensor-parallel-size`` / ``-spec-draft-tp``,
    ``--speculative-model-quantization``, ``--speculative-max-model-len``, and the
    shorthands ``--spec-method/--spec-model/--spec-tokens``; each as ``--flag value`` or
    ``--flag=value``.

    Raises
    ------
    SpecError
        Malformed JSON, k < 1, a flag without a value, a flag given twice, or legacy flags
        beside ``--speculative-config``.

    Examples
    --------
    >>> parsed = parse_vllm_args(
    ...     ["serve", "m", "--speculative-model", "[ngram]", "--num-speculative-tokens", "4"]
    ... )
    >>> parsed.spec.method, parsed.spec.num_speculative_tokens
    ('ngram', 4)
    >>> parsed.notes[-1]
    'legacy --speculative-model/--num-speculative-tokens migrated into --speculative-config'
    """
    tokens = list(argv)
    return _read_vllm(tokens, _scan(tokens, _resolve_vllm))[0]


def render_vllm_args(argv: Sequence[str], spec: SpecConfig | None) -> list[str]:
    """Return ``argv`` with its speculative settings replaced by ``spec``.

    All speculative flags (new, legacy, dotted, shorthand) give way to one
    ``--speculative-config`` where the first of them stood, in ``--flag=value`` form if the
    old ``--speculative-config`` was written so; with none, it is appended. ``spec=None``
    removes them all. An argv whose one ``--speculative-config`` already reads as ``spec``
    is returned unchanged, whatever its spacing or key order.

    Examples
    --------
    >>> render_vllm_args(["serve", "m", "--port", "8000"], SpecConfig("mtp", 2))
    ['serve', 'm', '--port', '8000', '--speculative-config', '{"method":"mtp","num_speculative_tokens":2}']
    """  # noqa: E501
    tokens = list(argv)
    sglang_only = sorted(_SG_ADAPTIVE_KEYS & dict(spec.extra).keys()) if spec else []
    if sglang_only:
        raise SpecError(
            f"{', '.join(sglang_only)}: SGLang's {_SG_ADAPTIVE} has no vLLM key; vLLM's "
            f"in-engine modes are {_PER_BATCH_KEY} and {VERIFY_KEY}"
        )
    hits = _scan(tokens, _resolve_vllm)
    if spec is not None and hits:
        try:
            parsed, clean = _read_vllm(tokens, hits)
        except SpecError:
            clean = False  # a broken setting is simply replaced
        else:
            if clean and parsed.spec == spec:
                return tokens
    new: list[str] = []
    if spec is not None:
        text = spec.to_json()
        inline = any(hit.inline for hit in hits if hit.flag == _VLLM_CONFIG)
        new = [f"{_VLLM_CONFIG}={text}"] if inline else [_VLLM_CONFIG, text]
    drop = {index for hit in hits for index in range(hit.start, hit.stop)}
    at = hits[0].start if hits else _options_end(tokens)
    return _edit(tokens, drop, {at: new})


# --------------------------------------------------------------------------------------------
# SGLang (reference/engines.md §2.1)
# --------------------------------------------------------------------------------------------

_SG_ALGORITHM = "--speculative-algorithm"
_SG_DRAFT = "--speculative-draft-model-path"
_SG_STEPS = "--speculative-num-steps"
_SG_TOPK = "--speculative-eagle-topk"
_SG_DRAFT_TOKENS = "--speculative-num-draft-tokens"
# In-engine adaptive speculation (reference/engines.md §2.4): a bare switch, its JSON
# config, and the strategy flag proposed in sglang#28045.
_SG_ADAPTIVE = "--speculative-adaptive"
_SG_ADAPTIVE_CONFIG = "--speculative-adaptive-config"
_SG_ADAPTIVE_STRATEGY = "--speculative-adaptive-strategy"
_SG_ALIASES = {"--speculative-draft-model": _SG_DRAFT}
_SG_HANDLED = frozenset(
    {
        _SG_ALGORITHM,
        _SG_DRAFT,
        _SG_STEPS,
        _SG_TOPK,
        _SG_DRAFT_TOKENS,
        _SG_ADAPTIVE_CONFIG,
        _SG_ADAPTIVE_STRATEGY,
    }
)
# SGLang's other speculative flags: left alone, but needed to tell whether an abbreviation
# is ambiguous, as argparse does.
_SG_OTHER = frozenset(
    {
        "--speculative-draft-model-revision",
        "--speculative-draft-load-format",
        "--speculative-accept-threshold-single",
        "--speculative-accept-threshold-acc",
        "--speculative-token-map",
        "--speculative-attention-mode",
        "--speculative-draft-attention-backend",
        "--speculative-moe-runner-backend",
        "--speculative-moe-a2a-backend",
        "--speculative-draft-model-quantization",
        "--speculative-ngram-min-bfs-breadth",
        "--speculative-ngram-max-bfs-breadth",
        "--speculative-ngram-match-type",
        "--speculative-ngram-max-trie-depth",
        "--speculative-ngram-capacity",
        "--speculative-ngram-external-corpus-path",
        "--speculative-ngram-external-sam-budget",
        "--speculative-ngram-external-corpus-max-tokens",
        _SG_ADAPTIVE,
    }
)
_SG_OPTION_STRINGS = tuple(sorted({*_SG_HANDLED, *_SG_ALIASES, *_SG_OTHER}))
# SGLang algorithm -> vLLM method. NEXTN is SGLang's MTP; LOOKAHEAD is NGRAM's old name.
_SG_METHODS = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
    # In SGLang's TPU/Pallas args and third-party launch scripts (reference/engines.md §2.1).
    "DFLASH": "dflash",
}
_SG_OLD_ALGORITHMS = {"LOOKAHEAD": "NGRAM"}
_SG_ALGORITHMS = {method: algorithm for algorithm, method in _SG_METHODS.items()}
# SGLang settings that have no SpecConfig field, kept in SpecConfig.extra under the names
# of SGLang's ServerArgs.
_TOPK_KEY = "speculative_eagle_topk"
_DRAFT_TOKENS_KEY = "speculative_num_draft_tokens"
_STEPS_KEY = "speculative_num_steps"
#: SpecConfig.extra keys of SGLang's adaptive speculation, named as SGLang's ServerArgs.
ADAPTIVE_KEY = "speculative_adaptive"
ADAPTIVE_CONFIG_KEY = "speculative_adaptive_config"
ADAPTIVE_STRATEGY_KEY = "speculative_adaptive_strategy"
#: vLLM's adaptive-verification switch in --speculative-config.
VERIFY_KEY = "adaptive_verification"
_SG_ADAPTIVE_KEYS = frozenset({ADAPTIVE_KEY, ADAPTIVE_CONFIG_KEY, ADAPTIVE_STRATEGY_KEY})
# Without --speculative-num-draft-tokens, SGLang drafts 12 tree tokens for NGRAM.
_SG_NGRAM_DEFAULT_DRAFT_TOKENS = 12
_SG_EXAMPLES = {
    _SG_ALGORITHM: "EAGLE3",
    _SG_DRAFT: "MODEL",
    _SG_STEPS: "3",
    _SG_TOPK: "1",
    _SG_DRAFT_TOKENS: "4",
    _SG_ADAPTIVE_CONFIG: "'{\"candidate_steps\":[1,3,7]}'",
    _SG_ADAPTIVE_STRATEGY: "throughput_aware",
}


def _adaptive_switches(argv: Sequence[str]) -> list[int]:
    """Indices of the bare ``--speculative-adaptive`` switch (a store_true flag)."""
    end = _options_end(argv)
    return [i for i, token in enumerate(argv[:end]) if token == _SG_ADAPTIVE]


def _resolve_sglang(name: str) -> str | None:
    if name in _SG_HANDLED:
        return name
    if name in _SG_ALIASES:
        return _SG_ALIASES[name]
    if name in _SG_OTHER or not name.startswith("--spec"):
        return None
    # argparse takes an unambiguous prefix of a long option for the option.
    candidates = [option for option in _SG_OPTION_STRINGS if option.startswith(name)]
    actions = {_SG_ALIASES.get(option, option) for option in candidates}
    if len(actions) > 1:
        raise SpecError(
            f"{name} is ambiguous: it could be {', '.join(candidates)}; write the full flag name"
        )
    flag = actions.pop() if actions else None
    return flag if flag in _SG_HANDLED else None


def _read_sglang(hits: Sequence[_Hit], switched: bool = False) -> ParsedArgs:
    _check_hits(hits, _SG_EXAMPLES)
    notes: list[str] = []
    abbreviated = [hit for hit in hits if hit.spelled not in (hit.flag, *_SG_ALIASES)]
    if abbreviated:
        read = ", ".join(f"{hit.spelled} as {hit.flag}" for hit in abbreviated)
        notes.append(f"abbreviated flags read: {read} (render writes full names)")
    values = {hit.flag: hit.value for hit in hits if hit.value is not None}
    spelled = {hit.flag: hit.spelled for hit in hits}
    written = values.get(_SG_ALGORITHM)
    if written is None:
        if hits:
            names = ", ".join(hit.spelled for hit in hits)
            notes.append(
                f"{names} set without {_SG_ALGORITHM}; SGLang does not speculate, so "
                f"they do nothing"
            )
        return ParsedArgs(None, tuple(notes))

    algorithm = written.strip().upper()
    if algorithm in _SG_OLD_ALGORITHMS:
        notes.append(
            f"{spelled[_SG_ALGORITHM]} {written} is the old name of "
            f"{_SG_OLD_ALGORITHMS[algorithm]}; render writes {_SG_OLD_ALGORITHMS[algorithm]}"
        )
        algorithm = _SG_OLD_ALGORITHMS[algorithm]
    if algorithm not in _SG_METHODS:
        raise SpecError(
            f"{spelled[_SG_ALGORITHM]} {written!r} is not an algorithm this knows; "
            f"use one of {', '.join(_SG_METHODS)}"
        )
    method = _SG_METHODS[algorithm]
    model = values.get(_SG_DRAFT)
    if method in _NEEDS_MODEL and model is None:
        raise SpecError(
            f"{spelled[_SG_ALGORITHM]} {algorithm} needs {_SG_DRAFT}; set it to the draft model"
        )

    def number(flag: str, minimum: int) -> int | None:
        text = values.get(flag)
        return None if text is None else _int_value(text, spelled[flag], minimum=minimum)

    steps = number(_SG_STEPS, 1)
    topk = number(_SG_TOPK, 1)
    draft_tokens = number(_SG_DRAFT_TOKENS, 2 if algorithm == "NGRAM" else 1)
    extra: dict[str, Any] = {}
    if algorithm == "NGRAM":
        # SGLang's NGRAM worker verifies a tree of num_draft_tokens (the last accepted token
        # plus the drafts); it ignores --speculative-num-steps and sets topk itself.
        if draft_tokens is None:
            draft_tokens = _SG_NGRAM_DEFAULT_DRAFT_TOKENS
            notes.append(
                f"{_SG_DRAFT_TOKENS} not set; SGLang drafts {draft_tokens} tree tokens for "
                f"NGRAM, so k = {draft_tokens - 1} (render writes it out)"
            )
        k = draft_tokens - 1
        if steps is not None:
            extra[_STEPS_KEY] = steps
        if topk is not None:
            extra[_TOPK_KEY] = topk
    else:
        if steps is None:
            raise SpecError(
                f"{_SG_STEPS} is not set, so SGLang picks k from the model architecture; set "
                f"{_SG_STEPS}, {_SG_TOPK} and {_SG_DRAFT_TOKENS}"
            )
        k = steps
        if topk is None:
            topk = 1
            notes.append(
                f"{_SG_TOPK} not set; SGLang needs it beside {_SG_STEPS}, and render writes "
                f"{_SG_TOPK} 1"
            )
        if topk != 1:
            extra[_TOPK_KEY] = topk
            if draft_tokens is None:
                raise SpecError(
                    f"{_SG_DRAFT_TOKENS} is not set; with {_SG_TOPK} {topk} SGLang needs it, "
                    f"set it to the tokens verified per step"
                )
        # With topk 1, SGLang itself sets num_draft_tokens to steps + 1; keep only a
        # different value, verbatim.
        if draft_tokens is not None and (topk != 1 or draft_tokens != k + 1):
            extra[_DRAFT_TOKENS_KEY] = draft_tokens
    extra.update(_read_adaptive(values, spelled, switched, notes))
    spec = SpecConfig(
        method=method, num_speculative_tokens=k, model=model, extra=tuple(extra.items())
    )
    return ParsedArgs(spec, tuple(notes))


def _read_adaptive(
    values: Mapping[str, str], spelled: Mapping[str, str], switched: bool, notes: list[str]
) -> dict[str, Any]:
    """The adaptive-speculation settings, as SpecConfig.extra items."""
    out: dict[str, Any] = {}
    config = values.get(_SG_ADAPTIVE_CONFIG)
    strategy = values.get(_SG_ADAPTIVE_STRATEGY)
    if not switched:
        if config is not None or strategy is not None:
            flag = spelled[_SG_ADAPTIVE_CONFIG if config is not None else _SG_ADAPTIVE_STRATEGY]
            notes.append(f"{flag} set without {_SG_ADAPTIVE}; SGLang ignores it")
        return out
    out[ADAPTIVE_KEY] = True
    if config is not None:
        try:
            data = json.loads(config)
        except json.JSONDecodeError:
            data = config  # a file path: kept verbatim
        out[ADAPTIVE_CONFIG_KEY] = data
    if strategy is not None:
        out[ADAPTIVE_STRATEGY_KEY] = strategy.strip()
    return out


def _extra_int(extra: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = extra.get(key, default)
    if value is not None and (not _is_int(value) or value < 1):
        raise SpecError(f"extra {key} must be an integer >= 1, got {_show(value)}")
    return None if value is None else int(value)


def _sglang_flags(spec: SpecConfig) -> list[tuple[str, str]]:
    """The handled SGLang flags, in order, with the values that say ``spec``."""
    algorithm = _SG_ALGORITHMS.get(spec.method)
    if algorithm is None:
        raise SpecError(
            f"method {spec.method!r} has no SGLang {_SG_ALGORITHM}; use one of "
            f"{', '.join(_SG_ALGORITHMS)}"
        )
    vllm_only = {
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
        "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        _PER_BATCH_KEY: spec.per_batch_size,
    }
    for key, value in vllm_only.items():
        if value is not None:
            raise SpecError(f"{key} is a vLLM setting with no SGLang flag; leave it unset")
    extra = dict(spec.extra)
    adaptive = {key: extra.pop(key) for key in _SG_ADAPTIVE_KEYS if key in extra}
    if adaptive and adaptive.get(ADAPTIVE_KEY) is not True:
        raise SpecError(
            f"extra {', '.join(sorted(adaptive))} set without {ADAPTIVE_KEY}: true; set it, "
            "or drop them"
        )
    if adaptive and algorithm not in ("EAGLE", "EAGLE3"):
        raise SpecError(
            f"{_SG_ADAPTIVE} runs with EAGLE and EAGLE3 only (reference/engines.md §2.4), "
            f"not {algorithm}; drop it or use an eagle drafter"
        )
    if adaptive and extra.get(_TOPK_KEY, 1) != 1:
        raise SpecError(
            f"{_SG_ADAPTIVE} needs {_SG_TOPK} 1 (SGLang falls back to static speculation "
            "otherwise); drop extra speculative_eagle_topk"
        )
    if algorithm == "NGRAM":
        allowed = {_STEPS_KEY, _TOPK_KEY}
        if _DRAFT_TOKENS_KEY in extra:
            raise SpecError(
                f"extra {_DRAFT_TOKENS_KEY} is not used for NGRAM, where it is k + 1; drop it"
            )
    else:
        allowed = {_TOPK_KEY, _DRAFT_TOKENS_KEY}
        if _STEPS_KEY in extra:
            raise SpecError(
                f"extra {_STEPS_KEY} is not used for {algorithm}, where it is "
                f"num_speculative_tokens; drop it"
            )
    for key in sorted(set(extra) - allowed):
        raise SpecError(
            f"extra key {key!r} has no SGLang flag for {algorithm}; the keys SGLang takes "
            f"are {', '.join(sorted(allowed))}"
        )

    flags = [(_SG_ALGORITHM, algorithm)]
    if spec.model is not None:
        flags.append((_SG_DRAFT, spec.model))
    k = spec.num_speculative_tokens
    if algorithm == "NGRAM":
        for flag, key in ((_SG_STEPS, _STEPS_KEY), (_SG_TOPK, _TOPK_KEY)):
            value = _extra_int(extra, key)
            if value is not None:
                flags.append((flag, str(value)))
        flags.append((_SG_DRAFT_TOKENS, str(k + 1)))
        return flags
    topk = _extra_int(extra, _TOPK_KEY, 1)
    draft_tokens = _extra_int(extra, _DRAFT_TOKENS_KEY)
    if draft_tokens is None:
        if topk != 1:
            raise SpecError(
                f"extra {_TOPK_KEY}={topk} needs extra {_DRAFT_TOKENS_KEY} "
                f"({_SG_DRAFT_TOKENS}); set it"
            )
        draft_tokens = k + 1
    flags += [(_SG_STEPS, str(k)), (_SG_TOPK, str(topk)), (_SG_DRAFT_TOKENS, str(draft_tokens))]
    if ADAPTIVE_CONFIG_KEY in adaptive:
        config = adaptive[ADAPTIVE_CONFIG_KEY]
        text = (
            config
            if isinstance(config, str)
            else json.dumps(config, sort_keys=True, separators=(",", ":"))
        )
        flags.append((_SG_ADAPTIVE_CONFIG, text))
    if ADAPTIVE_STRATEGY_KEY in adaptive:
        flags.append((_SG_ADAPTIVE_STRATEGY, str(adaptive[ADAPTIVE_STRATEGY_KEY])))
    return flags


def _wants_adaptive(spec: SpecConfig | None) -> bool:
    return spec is not None and dict(spec.extra).get(ADAPTIVE_KEY) is True


def parse_sglang_args(argv: Sequence[str]) -> ParsedArgs:
    """Read the speculative config from an SGLang command line.

    ``--speculative-algorithm`` (case-insensitive; EAGLE, EAGLE3, NEXTN -> ``mtp``,
    STANDALONE -> ``draft_model``, NGRAM -> ``ngram``) gives the method;
    ``--speculative-draft-model-path`` (or ``--speculative-draft-model``) the model;
    ``--speculative-num-steps`` gives k. For NGRAM, which ignores the steps, k is
    ``--speculative-num-draft-tokens`` - 1. ``--speculative-eagle-topk`` and
    ``--speculative-num-draft-tokens`` go into ``extra`` as ``speculative_eagle_topk`` and
    ``speculative_num_draft_tokens``, except where they hold what a render derives (topk 1,
    num-draft-tokens k + 1). Unambiguous prefixes (``--speculative-algo``) are read as
    argparse reads them.

    Raises
    ------
    SpecError
        An ambiguous prefix (listing the candidates), an unknown algorithm, a flag without
        a value or given twice, k < 1, or settings SGLang cannot start with.
    """
    tokens = list(argv)
    return _read_sglang(_scan(tokens, _resolve_sglang), bool(_adaptive_switches(tokens)))


def render_sglang_args(argv: Sequence[str], spec: SpecConfig | None) -> list[str]:
    """Return ``argv`` with its speculative settings replaced by ``spec``.

    Writes ``--speculative-algorithm``, ``--speculative-draft-model-path`` (when there is a
    model), and ``--speculative-num-steps`` k, ``--speculative-eagle-topk`` and
    ``--speculative-num-draft-tokens`` (for NGRAM only the last, k + 1), in full names.
    Each flag already present keeps its position and its ``=`` form; the rest follow the
    last speculative flag, or go at the end. ``spec=None`` removes them; SGLang's other
    speculative flags (``--speculative-token-map``, ...) are left alone.

    Raises
    ------
    SpecError
        ``spec`` uses what SGLang has no flag for (a method without an SGLang algorithm,
        prompt-lookup bounds, a draft TP size, a per-batch-size schedule, other extra keys).
    """
    tokens = list(argv)
    hits = _scan(tokens, _resolve_sglang)
    wanted = _sglang_flags(spec) if spec is not None else []
    values = dict(wanted)
    drop: set[int] = set()
    insert: dict[int, list[str]] = {}
    # The bare --speculative-adaptive switch stays where it is when it is wanted (one of
    # them), goes when it is not, and is added after the other flags when missing.
    switches = _adaptive_switches(tokens)
    keep_switch = _wants_adaptive(spec) and bool(switches)
    drop.update(switches[1:] if keep_switch else switches)
    if _wants_adaptive(spec) and not switches:
        wanted = [*wanted, (_SG_ADAPTIVE, "")]
    for hit in hits:
        drop.update(range(hit.start, hit.stop))
        if hit.flag in values:
            value = values.pop(hit.flag)
            insert[hit.start] = [f"{hit.flag}={value}"] if hit.inline else [hit.flag, value]
    rest = [
        token
        for flag, value in wanted
        if flag in values or flag == _SG_ADAPTIVE
        for token in ((flag,) if flag == _SG_ADAPTIVE else (flag, value))
    ]
    if rest:
        at = hits[-1].stop if hits else _options_end(tokens)
        insert.setdefault(at, []).extend(rest)
    return _edit(tokens, drop, insert)
