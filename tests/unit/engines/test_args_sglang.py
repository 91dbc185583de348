"""SGLang speculative flags: read, abbreviations, render (reference/engines.md §2.1)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.engines.args import SpecConfig, parse_sglang_args, render_sglang_args
from spectune.errors import SpecError

LAUNCH = ["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B"]
HANDLED = (
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)


def flag_values(argv: list[str]) -> dict[str, str]:
    """The handled flags of a rendered argv, which writes each once in full."""
    values: dict[str, str] = {}
    for index, token in enumerate(argv):
        name, equals, inline = token.partition("=")
        if name in HANDLED:
            assert name not in values, argv
            values[name] = inline if equals else argv[index + 1]
    return values


# --- reading ----------------------------------------------------------------------------------


def test_eagle3_with_its_draft_and_a_chain_reads_steps_as_k() -> None:
    argv = [
        *LAUNCH,
        *shlex.split(
            "--speculative-algorithm EAGLE3 "
            "--speculative-draft-model-path jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B "
            "--speculative-num-steps 5 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 6 --port 30000"
        ),
    ]
    parsed = parse_sglang_args(argv)
    assert parsed.spec == SpecConfig(
        "eagle3", 5, model="jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
    )
    assert parsed.notes == ()
    assert render_sglang_args(argv, parsed.spec) == argv


@pytest.mark.parametrize(
    ("algorithm", "method"),
    [
        ("EAGLE", "eagle"),
        ("EAGLE3", "eagle3"),
        ("NEXTN", "mtp"),
        ("STANDALONE", "draft_model"),
        ("eagle3", "eagle3"),
        ("NextN", "mtp"),
    ],
)
def test_algorithms_map_to_vllm_method_names_in_any_case(algorithm: str, method: str) -> None:
    argv = [
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model",
        "draft",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    spec = parse_sglang_args(argv).spec
    assert spec == SpecConfig(method, 3, model="draft")
    # And back: the render writes SGLang's upper-case name.
    assert flag_values(render_sglang_args(argv, spec))["--speculative-algorithm"] == (
        algorithm.upper()
    )


def test_a_tree_keeps_topk_and_draft_tokens_in_extra() -> None:
    argv = shlex.split(
        "--speculative-algorithm EAGLE --speculative-draft-model-path d "
        "--speculative-num-steps 4 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8"
    )
    spec = parse_sglang_args(argv).spec
    assert spec == SpecConfig(
        "eagle",
        4,
        model="d",
        extra=(("speculative_eagle_topk", 2), ("speculative_num_draft_tokens", 8)),
    )
    assert render_sglang_args(argv, spec) == argv


def test_ngram_k_is_draft_tokens_minus_one() -> None:
    argv = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]
    assert parse_sglang_args(argv).spec == SpecConfig("ngram", 7)
    out = render_sglang_args(argv, SpecConfig("ngram", 3))
    assert out == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]


def test_ngram_without_draft_tokens_uses_sglangs_default_of_twelve() -> None:
    parsed = parse_sglang_args(["--speculative-algorithm", "ngram"])
    assert parsed.spec == SpecConfig("ngram", 11)
    assert any("12" in note for note in parsed.notes)


def test_lookahead_is_read_as_ngram_and_rewritten() -> None:
    argv = ["--speculative-algorithm", "LOOKAHEAD", "--speculative-num-draft-tokens", "5"]
    parsed = parse_sglang_args(argv)
    assert parsed.spec == SpecConfig("ngram", 4)
    assert flag_values(render_sglang_args(argv, parsed.spec))["--speculative-algorithm"] == "NGRAM"


def test_no_algorithm_means_no_speculation_even_with_other_flags() -> None:
    parsed = parse_sglang_args([*LAUNCH, "--speculative-num-steps", "3"])
    assert parsed.spec is None
    assert any("--speculative-algorithm" in note for note in parsed.notes)
    assert parse_sglang_args(LAUNCH) == parse_sglang_args([])


def test_missing_topk_is_noted_and_render_supplies_it() -> None:
    argv = shlex.split("--speculative-algorithm NEXTN --speculative-num-steps 2")
    parsed = parse_sglang_args(argv)
    assert parsed.spec == SpecConfig("mtp", 2)
    assert any("--speculative-eagle-topk" in note for note in parsed.notes)
    out = render_sglang_args(argv, parsed.spec)
    assert out == [
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
    ]


# --- abbreviations ----------------------------------------------------------------------------


def test_unambiguous_prefixes_read_as_argparse_does_and_render_writes_full_names() -> None:
    argv = [
        *LAUNCH,
        *shlex.split(
            "--speculative-algo EAGLE --speculative-draft-model-p d --speculative-num-st 3 "
            "--speculative-eagle=1 --port 30000"
        ),
    ]
    parsed = parse_sglang_args(argv)
    assert parsed.spec == SpecConfig("eagle", 3, model="d")
    assert any("--speculative-algo as --speculative-algorithm" in note for note in parsed.notes)
    out = render_sglang_args(argv, parsed.spec)
    assert out == [
        *LAUNCH,
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-draft-model-path",
        "d",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk=1",
        "--speculative-num-draft-tokens",
        "4",
        "--port",
        "30000",
    ]
    assert parse_sglang_args(out).notes == ()


@pytest.mark.parametrize(
    ("prefix", "candidates"),
    [
        ("--speculative-num", "--speculative-num-draft-tokens, --speculative-num-steps"),
        ("--speculative-draft-model-", "--speculative-draft-model-path, "),
        ("--speculative-a", "--speculative-accept-threshold-acc, "),
    ],
)
def test_an_ambiguous_prefix_lists_the_candidates(prefix: str, candidates: str) -> None:
    argv = ["--speculative-algorithm", "EAGLE", prefix, "3"]
    with pytest.raises(SpecError, match=f"{prefix} is ambiguous: it could be {candidates}"):
        parse_sglang_args(argv)
    with pytest.raises(SpecError, match="ambiguous"):
        render_sglang_args(argv, SpecConfig("mtp", 1))


def test_other_speculative_flags_are_not_taken_for_handled_ones() -> None:
    argv = [*LAUNCH, "--speculative-token-map", "thunlp/LLaMA3-Instruct-8B-FR-Spec/freq.pt"]
    assert render_sglang_args(argv, None) == argv
    assert parse_sglang_args(argv).spec is None


# --- rendering --------------------------------------------------------------------------------


def test_render_appends_a_full_chain_when_there_was_no_setting() -> None:
    out = render_sglang_args([*LAUNCH, "--port", "30000"], SpecConfig("mtp", 3))
    assert out == [
        *LAUNCH,
        "--port",
        "30000",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]


def test_render_keeps_an_explicit_draft_token_count() -> None:
    spec = SpecConfig("eagle", 3, model="d", extra=(("speculative_num_draft_tokens", 6),))
    values = flag_values(render_sglang_args([], spec))
    assert values["--speculative-eagle-topk"] == "1"
    assert values["--speculative-num-draft-tokens"] == "6"


def test_topk_one_in_extra_renders_like_no_topk() -> None:
    plain = SpecConfig("eagle3", 4, model="d")
    explicit = SpecConfig("eagle3", 4, model="d", extra=(("speculative_eagle_topk", 1),))
    assert render_sglang_args(LAUNCH, explicit) == render_sglang_args(LAUNCH, plain)


def test_render_changes_values_in_place_and_adds_what_was_missing_after_them() -> None:
    argv = shlex.split(
        "--speculative-algorithm=EAGLE --speculative-draft-model-path d "
        "--speculative-num-steps 5 --port 1"
    )
    out = render_sglang_args(argv, SpecConfig("eagle", 2, model="d"))
    assert out == [
        "--speculative-algorithm=EAGLE",
        "--speculative-draft-model-path",
        "d",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
        "--port",
        "1",
    ]


def test_render_none_removes_the_handled_flags_only() -> None:
    argv = [
        *LAUNCH,
        *shlex.split(
            "--speculative-algorithm EAGLE --speculative-draft-model-path d "
            "--speculative-token-map m.pt --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --port 1"
        ),
    ]
    out = render_sglang_args(argv, None)
    assert out == [*LAUNCH, "--speculative-token-map", "m.pt", "--port", "1"]


def test_switching_to_ngram_drops_the_draft_model_and_steps() -> None:
    argv = shlex.split(
        "--speculative-algorithm EAGLE --speculative-draft-model-path d "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    )
    out = render_sglang_args(argv, SpecConfig("ngram", 7))
    assert out == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("--speculative-algorithm MEDUSA", r"'MEDUSA' is not an algorithm .* EAGLE, EAGLE3, NEXTN"),
        ("--speculative-algorithm EAGLE --speculative-num-steps 3", r"needs --speculative-draft"),
        (
            "--speculative-algorithm NEXTN --speculative-eagle-topk 1",
            r"--speculative-num-steps is not set",
        ),
        (
            "--speculative-algorithm NEXTN --speculative-num-steps 0 --speculative-eagle-topk 1",
            r"--speculative-num-steps must be >= 1, got 0",
        ),
        (
            "--speculative-algorithm NEXTN --speculative-num-st x",
            r"--speculative-num-st must be an integer, got 'x'",
        ),
        (
            "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 4",
            r"--speculative-num-draft-tokens is not set; with --speculative-eagle-topk 4",
        ),
        ("--speculative-algorithm", r"--speculative-algorithm has no value"),
        (
            "--speculative-algorithm NGRAM --speculative-num-draft-tokens 1",
            r"--speculative-num-draft-tokens must be >= 2",
        ),
        (
            "--speculative-algorithm NEXTN --speculative-algo NEXTN",
            r"--speculative-algorithm and --speculative-algo: .* given twice",
        ),
    ],
)
def test_bad_flags_raise_one_line_errors_naming_the_flag(command: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_sglang_args(command.split())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SpecConfig("suffix", 8), r"'suffix' has no SGLang --speculative-algorithm"),
        (
            SpecConfig("eagle", 3, model="d", per_batch_size=((1, 8, 3),)),
            r"num_speculative_tokens_per_batch_size is a vLLM setting",
        ),
        (SpecConfig("ngram", 3, prompt_lookup_max=4), r"prompt_lookup_max is a vLLM setting"),
        (
            SpecConfig("eagle", 3, model="d", extra=(("speculative_eagle_topk", 4),)),
            r"needs extra speculative_num_draft_tokens",
        ),
        (
            SpecConfig("eagle", 3, model="d", extra=(("max_model_len", 4),)),
            r"extra key 'max_model_len' has no SGLang flag",
        ),
        (
            SpecConfig("ngram", 3, extra=(("speculative_num_draft_tokens", 4),)),
            r"not used for NGRAM",
        ),
    ],
)
def test_settings_sglang_has_no_flag_for_are_refused_on_render(
    spec: SpecConfig, message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        render_sglang_args(LAUNCH, spec)


# --- properties over generated command lines --------------------------------------------------

_WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789./_", min_size=1, max_size=12)
_UNRELATED = st.one_of(
    st.tuples(st.just("--port"), st.integers(1024, 65535).map(str)),
    st.tuples(st.sampled_from(["--tp-size", "--dp-size", "--tp"]), st.sampled_from("1248")),
    st.tuples(st.just("--mem-fraction-static"), st.sampled_from(["0.7", "0.85"])),
    st.tuples(st.just("--cuda-graph-max-bs"), st.integers(1, 512).map(str)),
    st.tuples(
        st.sampled_from(["--enable-metrics", "--trust-remote-code", "--disable-radix-cache"])
    ),
    st.tuples(st.just("--speculative-token-map"), _WORD),
    st.tuples(st.just("--speculative-accept-threshold-single=0.9")),
    st.tuples(st.just("--speculative-ngram-max-bfs-breadth"), st.sampled_from("1234")),
)
_PREFIXES = st.sampled_from(
    [
        [],
        ["python3", "-m", "sglang.launch_server", "--model-path", "m"],
        ["sglang", "serve", "--model-path", "Qwen/Qwen3-8B"],
    ]
)
_SPELLINGS = {
    "--speculative-algorithm": ["--speculative-algorithm", "--speculative-algo"],
    "--speculative-draft-model-path": [
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        "--speculative-draft-model-p",
    ],
    "--speculative-num-steps": ["--speculative-num-steps", "--speculative-num-st"],
    "--speculative-eagle-topk": ["--speculative-eagle-topk", "--speculative-eagle"],
    "--speculative-num-draft-tokens": ["--speculative-num-draft-tokens", "--speculative-num-d"],
}


@st.composite
def spec_configs(draw: st.DrawFn) -> SpecConfig:
    """Configs in the form the parser gives back: derivable values are left out of extra."""
    method = draw(st.sampled_from(["eagle", "eagle3", "mtp", "draft_model", "ngram"]))
    k = draw(st.integers(1, 10))
    needs_model = method in {"eagle", "eagle3", "draft_model"}
    model = draw(_WORD) if needs_model else draw(st.none() | _WORD)
    extra: dict[str, int] = {}
    if method == "ngram":
        for key in ("speculative_num_steps", "speculative_eagle_topk"):
            if draw(st.booleans()):
                extra[key] = draw(st.integers(1, 8))
    else:
        shape = draw(st.sampled_from(["chain", "tree", "chain-other-count"]))
        if shape == "tree":
            extra["speculative_eagle_topk"] = draw(st.integers(2, 8))
            extra["speculative_num_draft_tokens"] = draw(st.integers(1, 64))
        elif shape == "chain-other-count":
            extra["speculative_num_draft_tokens"] = draw(
                st.integers(1, 64).filter(lambda n: n != k + 1)
            )
    return SpecConfig(method, k, model=model, extra=tuple(extra.items()))


@st.composite
def existing_settings(draw: st.DrawFn) -> list[list[str]]:
    """Handled flags an argv may already carry, spelled in any accepted way."""
    old = draw(st.none() | spec_configs())
    if old is None:
        return []
    groups = []
    for flag, value in flag_values(render_sglang_args([], old)).items():
        name = draw(st.sampled_from(_SPELLINGS[flag]))
        groups.append([f"{name}={value}"] if draw(st.booleans()) else [name, value])
    return groups


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """An argv, and the tokens of it that are not handled flags, in order."""
    prefix = draw(_PREFIXES)
    unrelated = [(True, list(group)) for group in draw(st.lists(_UNRELATED, max_size=6))]
    existing = [(False, group) for group in draw(existing_settings())]
    argv = list(prefix)
    kept = list(prefix)
    for is_unrelated, group in draw(st.permutations([*unrelated, *existing])):
        argv.extend(group)
        if is_unrelated:
            kept.extend(group)
    return argv, kept


def without_handled_flags(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in HANDLED:
            skip = True
        elif token.partition("=")[0] not in HANDLED:
            out.append(token)
    return out


@settings(max_examples=300, deadline=None)
@given(command_lines(), st.none() | spec_configs())
def test_render_round_trips_is_idempotent_and_keeps_other_args(
    line: tuple[list[str], list[str]], spec: SpecConfig | None
) -> None:
    argv, kept = line
    out = render_sglang_args(argv, spec)
    assert render_sglang_args(out, spec) == out
    parsed = parse_sglang_args(out)
    assert parsed.spec == spec
    assert parsed.notes == ()
    assert without_handled_flags(out) == kept
    if spec is None:
        assert flag_values(out) == {}
