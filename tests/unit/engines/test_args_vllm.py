"""vLLM speculative settings on the command line: read, migrate, render (engines.md §1.7)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.engines.args import SpecConfig, parse_vllm_args, render_vllm_args
from spectune.errors import SpecError

# The examples of reference/engines.md §1.7, verbatim.
DOC_EXAMPLES = [
    (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        '\'{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":5}\'',
        SpecConfig("eagle3", 5, model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    ),
    (
        "vllm serve <m> --speculative-config "
        '\'{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}\'',
        SpecConfig("ngram", 4, prompt_lookup_min=2, prompt_lookup_max=5),
    ),
    (
        'vllm serve <m> --speculative-config \'{"method":"mtp","num_speculative_tokens":1}\'',
        SpecConfig("mtp", 1),
    ),
    (
        'vllm serve <m> --speculative-config \'{"method":"suffix","num_speculative_tokens":8}\'',
        SpecConfig("suffix", 8),
    ),
    (
        "vllm serve <m> --speculative-config "
        '\'{"method":"draft_model","model":"Qwen/Qwen3-0.6B","num_speculative_tokens":3}\'',
        SpecConfig("draft_model", 3, model="Qwen/Qwen3-0.6B"),
    ),
    (
        '--speculative-config \'{"method":"eagle","model":"yuhuili/EAGLE-LLaMA3.1-Instruct-8B",'
        '"num_speculative_tokens":3,\n'
        '  "num_speculative_tokens_per_batch_size":[[1,64,3],[65,128,1],[129,512,0]]}\'',
        SpecConfig(
            "eagle",
            3,
            model="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
            per_batch_size=((1, 64, 3), (65, 128, 1), (129, 512, 0)),
        ),
    ),
]


def spec_value(argv: list[str]) -> dict[str, object]:
    """The JSON a rendered argv passes to --speculative-config."""
    flags = [i for i, token in enumerate(argv) if token.startswith("--speculative-config")]
    assert len(flags) == 1, argv
    token = argv[flags[0]]
    text = token.partition("=")[2] if "=" in token else argv[flags[0] + 1]
    decoded = json.loads(text)
    assert isinstance(decoded, dict)
    return decoded


# --- the documented forms ---------------------------------------------------------------------


@pytest.mark.parametrize(("command", "expected"), DOC_EXAMPLES)
def test_documented_commands_parse_to_their_settings(command: str, expected: SpecConfig) -> None:
    parsed = parse_vllm_args(shlex.split(command))
    assert parsed.spec == expected
    assert parsed.notes == ()


@pytest.mark.parametrize(("command", "expected"), DOC_EXAMPLES)
def test_rendering_the_setting_an_argv_already_has_changes_nothing(
    command: str, expected: SpecConfig
) -> None:
    # Not even the spacing of the JSON: a needless change would restart the pods.
    argv = shlex.split(command)
    assert render_vllm_args(argv, expected) == argv


def test_a_new_k_replaces_only_the_json_in_place() -> None:
    argv = [*shlex.split(DOC_EXAMPLES[0][0]), "--port", "8000"]
    spec = replace(DOC_EXAMPLES[0][1], num_speculative_tokens=3)
    out = render_vllm_args(argv, spec)
    assert out[:4] == argv[:4]
    assert out[5:] == argv[5:]
    assert json.loads(out[4]) == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }


def test_to_json_is_canonical_and_from_json_reads_it_back() -> None:
    spec = SpecConfig(
        "eagle",
        3,
        model="m",
        per_batch_size=((1, 8, 3), (9, 32, 0)),
        extra=(("max_model_len", 2048), ("draft_load_config", {"b": [1, 2]})),
    )
    text = spec.to_json()
    assert text == (
        '{"draft_load_config":{"b":[1,2]},"max_model_len":2048,"method":"eagle","model":"m",'
        '"num_speculative_tokens":3,"num_speculative_tokens_per_batch_size":[[1,8,3],[9,32,0]]}'
    )
    assert SpecConfig.from_json(text) == spec


def test_configs_that_render_alike_are_equal_and_hash_alike() -> None:
    # extra may hold lists, yet a config still keys a dict (the policy keys arms by config).
    one = SpecConfig("ngram", 4, extra=(("z", (1, 2)), ("a", True)))
    two = SpecConfig("ngram", 4, extra=(("a", True), ("z", [1, 2])))
    assert one == two
    assert {one: "arm"}[two] == "arm"
    assert SpecConfig("ngram", 4, extra=(("a", 1),)) != SpecConfig("ngram", 4, extra=(("a", True),))


def test_keys_it_does_not_model_survive_parse_and_render() -> None:
    argv = [
        "--speculative-config",
        '{"method": "eagle", "model": "m", "num_speculative_tokens": 3, '
        '"max_model_len": 2048, "disable_padded_drafter_batch": true, '
        '"draft_load_config": {"x": [1, 2]}}',
    ]
    spec = parse_vllm_args(argv).spec
    assert spec is not None
    out = render_vllm_args(argv, replace(spec, num_speculative_tokens=5))
    assert spec_value(out) == {
        "method": "eagle",
        "model": "m",
        "num_speculative_tokens": 5,
        "max_model_len": 2048,
        "disable_padded_drafter_batch": True,
        "draft_load_config": {"x": [1, 2]},
    }


# --- inference of the method ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "method"),
    [
        ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
        ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3"),
        ("AngelSlim/Qwen3-8B_eagle3", "eagle3"),
        ("FasterDecoding/medusa-vicuna-7b-v1.3", "medusa"),
        ("Qwen/Qwen3-0.6B", "draft_model"),
    ],
)
def test_a_missing_method_is_inferred_from_the_model_name(model: str, method: str) -> None:
    text = json.dumps({"model": model, "num_speculative_tokens": 3})
    parsed = parse_vllm_args(["--speculative-config", text])
    assert parsed.spec == SpecConfig(method, 3, model=model)
    assert any("inferred" in note and method in note for note in parsed.notes)
    # The render spells the method out, so the next reader need not guess.
    assert spec_value(render_vllm_args(["--speculative-config", text], parsed.spec))["method"] == (
        method
    )


def test_an_ngram_model_means_the_ngram_method_without_a_model() -> None:
    text = '{"model": "[ngram]", "num_speculative_tokens": 4}'
    assert parse_vllm_args(["--speculative-config", text]).spec == SpecConfig("ngram", 4)


def test_a_deprecated_mtp_name_reads_as_mtp_and_render_rewrites_it() -> None:
    argv = ["serve", "deepseek-ai/DeepSeek-V3", "--speculative-config"]
    argv.append('{"method":"deepseek_mtp","num_speculative_tokens":1}')
    parsed = parse_vllm_args(argv)
    assert parsed.spec == SpecConfig("mtp", 1)
    assert any("deepseek_mtp" in note and "deprecated" in note for note in parsed.notes)
    assert spec_value(render_vllm_args(argv, parsed.spec))["method"] == "mtp"


# --- the legacy flags -------------------------------------------------------------------------


def test_legacy_ngram_flags_migrate_into_one_config_where_they_stood() -> None:
    argv = shlex.split(
        "python -m vllm.entrypoints.openai.api_server --model facebook/opt-6.7b "
        "--speculative-model [ngram] --num-speculative-tokens 5 "
        "--ngram-prompt-lookup-max 4 --ngram-prompt-lookup-min 2 --port 8000"
    )
    parsed = parse_vllm_args(argv)
    assert parsed.spec == SpecConfig("ngram", 5, prompt_lookup_min=2, prompt_lookup_max=4)
    assert parsed.notes[-1] == (
        "legacy --speculative-model/--num-speculative-tokens/--ngram-prompt-lookup-max/"
        "--ngram-prompt-lookup-min migrated into --speculative-config"
    )
    out = render_vllm_args(argv, parsed.spec)
    assert out == [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "facebook/opt-6.7b",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}',
        "--port",
        "8000",
    ]
    assert parse_vllm_args(out).notes == ()


def test_legacy_draft_model_with_short_draft_tp_flag() -> None:
    argv = shlex.split(
        "vllm serve facebook/opt-6.7b --speculative-model facebook/opt-125m "
        "-spec-draft-tp 1 --num-speculative-tokens=3 --speculative-max-model-len 2048"
    )
    parsed = parse_vllm_args(argv)
    assert parsed.spec == SpecConfig(
        "draft_model",
        3,
        model="facebook/opt-125m",
        draft_tensor_parallel_size=1,
        extra=(("max_model_len", 2048),),
    )
    out = render_vllm_args(argv, parsed.spec)
    assert out[:5] == ["vllm", "serve", "facebook/opt-6.7b", "--speculative-config", out[4]]
    assert len(out) == 5


def test_legacy_flags_beside_the_new_flag_are_refused() -> None:
    argv = ["--speculative-config", '{"method":"mtp","num_speculative_tokens":1}']
    with pytest.raises(SpecError, match=r"--speculative-config and legacy --num-speculative"):
        parse_vllm_args([*argv, "--num-speculative-tokens", "3"])


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("--num-speculative-tokens 3", "--speculative-model"),
        ("--speculative-model facebook/opt-125m", "--num-speculative-tokens"),
        ("--speculative-model [ngram] --num-speculative-tokens 0", "--num-speculative-tokens"),
        ("--speculative-model [ngram] --num-speculative-tokens four", "--num-speculative-tokens"),
    ],
)
def test_incomplete_or_bad_legacy_flags_name_the_flag(command: str, flag: str) -> None:
    with pytest.raises(SpecError, match=flag):
        parse_vllm_args(command.split())


# --- other spellings --------------------------------------------------------------------------


def test_equals_form_is_read_and_kept_on_render() -> None:
    argv = ["serve", "m", '--speculative-config={"method":"ngram","num_speculative_tokens":4}']
    assert parse_vllm_args(argv).spec == SpecConfig("ngram", 4)
    out = render_vllm_args(argv, SpecConfig("ngram", 2))
    assert out == [
        "serve",
        "m",
        '--speculative-config={"method":"ngram","num_speculative_tokens":2}',
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["-sc", '{"method":"mtp","num_speculative_tokens":2}'],
        ["--speculative_config", '{"method":"mtp","num_speculative_tokens":2}'],
        ["--speculative-config.method", "mtp", "--speculative-config.num_speculative_tokens=2"],
        ["--spec-method", "mtp", "--spec-tokens", "2"],
    ],
)
def test_aliases_dotted_keys_and_shorthands_read_as_one_config(argv: list[str]) -> None:
    assert parse_vllm_args(["serve", "m", *argv]).spec == SpecConfig("mtp", 2)
    out = render_vllm_args(["serve", "m", *argv, "--port", "1"], SpecConfig("mtp", 3))
    assert out == [
        "serve",
        "m",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":3}',
        "--port",
        "1",
    ]


def test_a_config_file_is_mentioned_because_it_is_not_read() -> None:
    notes = parse_vllm_args(["serve", "m", "--config", "serve.yaml"]).notes
    assert any("--config" in note for note in notes)


# --- rendering --------------------------------------------------------------------------------


def test_render_appends_when_there_was_no_setting() -> None:
    argv = ["vllm", "serve", "Qwen/Qwen3-8B", "--port", "8000"]
    assert render_vllm_args(argv, SpecConfig("suffix", 8)) == [
        *argv,
        "--speculative-config",
        '{"method":"suffix","num_speculative_tokens":8}',
    ]


def test_render_none_removes_every_speculative_flag_and_nothing_else() -> None:
    argv = shlex.split(
        "vllm serve Qwen/Qwen3-8B --speculative-model [ngram] --port 8000 "
        "--num-speculative-tokens 4 --enforce-eager"
    )
    assert render_vllm_args(argv, None) == [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--port",
        "8000",
        "--enforce-eager",
    ]
    assert parse_vllm_args(render_vllm_args(argv, None)).spec is None


def test_render_repairs_a_broken_setting() -> None:
    argv = ["serve", "m", "--speculative-config", "{not json", "--port", "1"]
    out = render_vllm_args(argv, SpecConfig("mtp", 1))
    assert out == [
        "serve",
        "m",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":1}',
        "--port",
        "1",
    ]


def test_render_puts_the_flag_before_a_bare_double_dash() -> None:
    out = render_vllm_args(["serve", "m", "--", "positional"], SpecConfig("mtp", 1))
    assert out[-2:] == ["--", "positional"]


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speculative-config", "{'method': 'ngram'}"], r"--speculative-config: malformed JSON"),
        (["--speculative-config", "[1, 2]"], r"--speculative-config: expected a JSON object"),
        (["serve", "m", "--speculative-config"], r"--speculative-config has no value"),
        (["--speculative-config", "--port", "8000"], r"--speculative-config has no value"),
        (["--speculative-config="], r"--speculative-config has no value"),
        (
            ["--speculative-config", '{"method":"ngram","num_speculative_tokens":0}'],
            r"num_speculative_tokens must be an integer >= 1, got 0",
        ),
        (
            ["--speculative-config", '{"method":"ngram"}'],
            r"num_speculative_tokens is missing",
        ),
        (
            ["--speculative-config", '{"method":"EAGLE3","model":"m","num_speculative_tokens":3}'],
            r"method must be a lowercase vLLM method name",
        ),
        (
            ["--speculative-config", '{"method":"eagle","num_speculative_tokens":3}'],
            r"method 'eagle' needs draft weights",
        ),
        (
            ["--speculative-config", '{"num_speculative_tokens":3}'],
            r"neither method nor model is set",
        ),
        (
            [
                "--speculative-config",
                '{"method":"ngram","num_speculative_tokens":3,"tensor_parallel_size":2}',
            ],
            r"use draft_tensor_parallel_size",
        ),
        (
            [
                "--speculative-config",
                '{"method":"ngram","num_speculative_tokens":3,'
                '"num_speculative_tokens_per_batch_size":[[1,64,3],[60,128,1]]}',
            ],
            r"\[60, 128, 1\] overlaps",
        ),
        (
            [
                "--speculative-config",
                '{"method":"ngram","num_speculative_tokens":3,'
                '"num_speculative_tokens_per_batch_size":[[1,64,4]]}',
            ],
            r"drafts 4 tokens; keep it between 0 and num_speculative_tokens \(3\)",
        ),
        (
            ["-sc", '{"method":"mtp","num_speculative_tokens":1}', "-sc", "{}"],
            r"-sc: --speculative-config is given twice",
        ),
        (
            [
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":1}',
                "--speculative-config.num_speculative_tokens",
                "2",
            ],
            r"--speculative-config and --speculative-config.num_speculative_tokens are both",
        ),
        (
            [
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":1}',
                "--spec-tokens",
                "2",
            ],
            r"--spec-tokens sets 'num_speculative_tokens', which --speculative-config already",
        ),
    ],
)
def test_bad_settings_raise_one_line_errors_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_vllm_args(argv)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "deepseek_mtp"}, "use 'mtp'"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min \\(5\\) is above"),
        ({"per_batch_size": ()}, "is empty"),
        ({"per_batch_size": ((0, 4, 1),)}, "needs 1 <= start_bs <= end_bs"),
        ({"per_batch_size": ((10, 20, 1), (1, 5, 1))}, "overlaps or comes before"),
        ({"extra": (("model", "x"),)}, "'model' is a SpecConfig field"),
        ({"extra": (("x", float("nan")),)}, "not JSON"),
    ],
)
def test_spec_config_refuses_what_vllm_would_refuse(
    kwargs: dict[str, object], message: str
) -> None:
    fields: dict[str, object] = {"method": "ngram", "num_speculative_tokens": 3, **kwargs}
    with pytest.raises(SpecError, match=message):
        SpecConfig(**fields)  # type: ignore[arg-type]


# --- properties over generated command lines --------------------------------------------------

_WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789./_", min_size=1, max_size=12)
_UNRELATED = st.one_of(
    st.tuples(st.just("--port"), st.integers(1024, 65535).map(str)),
    st.tuples(st.sampled_from(["-tp", "--tensor-parallel-size", "-pp"]), st.sampled_from("1248")),
    st.tuples(st.just("--served-model-name"), _WORD),
    st.tuples(st.just("--max-model-len"), st.integers(256, 131072).map(str)),
    st.tuples(
        st.sampled_from(["--enforce-eager", "--enable-prefix-caching", "--trust-remote-code"])
    ),
    st.tuples(st.just("--gpu-memory-utilization=0.9")),
    st.tuples(st.just("--override-generation-config"), st.just('{"temperature": 0.5}')),
    st.tuples(st.just("--speculative-disable-mqa-scorer")),
    st.tuples(st.just("-O3")),
)
_PREFIXES = st.sampled_from(
    [
        [],
        ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
        ["serve", "Qwen/Qwen3-8B"],
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"],
    ]
)
_EXTRA_VALUES = st.one_of(
    st.integers(-5, 5000),
    st.booleans(),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from("xyz"), st.integers(0, 9), max_size=2),
)


@st.composite
def schedules(draw: st.DrawFn, k: int) -> tuple[tuple[int, int, int], ...]:
    cuts = sorted(draw(st.sets(st.integers(1, 1024), min_size=2, max_size=8)))
    rows = []
    for start, end in zip(cuts[::2], cuts[1::2], strict=False):
        rows.append((start, end, draw(st.integers(0, k))))
    return tuple(rows)


@st.composite
def spec_configs(draw: st.DrawFn) -> SpecConfig:
    method = draw(
        st.sampled_from(["eagle", "eagle3", "mtp", "draft_model", "ngram", "suffix", "medusa"])
    )
    k = draw(st.integers(1, 16))
    needs_model = method in {"eagle", "eagle3", "draft_model", "medusa"}
    model = draw(_WORD) if needs_model else draw(st.none() | _WORD)
    low = draw(st.none() | st.integers(1, 4))
    high = draw(st.none() | st.integers(low or 1, 8))
    extra = draw(
        st.dictionaries(
            st.sampled_from(
                ["max_model_len", "quantization", "enforce_eager", "draft_load_config"]
            ),
            _EXTRA_VALUES,
            max_size=3,
        )
    )
    return SpecConfig(
        method,
        k,
        model=model,
        prompt_lookup_min=low,
        prompt_lookup_max=high,
        draft_tensor_parallel_size=draw(st.none() | st.sampled_from([1, 2, 4, 8])),
        per_batch_size=draw(st.none() | schedules(k)),
        extra=tuple(extra.items()),
    )


@st.composite
def existing_settings(draw: st.DrawFn) -> list[list[str]]:
    """Speculative flags an argv may already carry, as groups of tokens."""
    old = draw(spec_configs())
    form = draw(st.sampled_from(["none", "json", "equals", "short", "legacy"]))
    if form == "none":
        return []
    if form == "json":
        return [["--speculative-config", json.dumps(json.loads(old.to_json()), indent=1)]]
    if form == "equals":
        return [[f"--speculative-config={old.to_json()}"]]
    if form == "short":
        return [["-sc", old.to_json()]]
    return [
        ["--speculative-model", old.model or "[ngram]"],
        ["--num-speculative-tokens", str(old.num_speculative_tokens)],
        ["-spec-draft-tp", "1"],
    ]


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """An argv, and the tokens of it that are not speculative settings, in order."""
    prefix = draw(_PREFIXES)
    unrelated = [list(group) for group in draw(st.lists(_UNRELATED, max_size=6))]
    groups = draw(
        st.permutations(
            [*[(True, g) for g in unrelated], *[(False, g) for g in draw(existing_settings())]]
        )
    )
    argv = list(prefix)
    kept = list(prefix)
    for is_unrelated, group in groups:
        argv.extend(group)
        if is_unrelated:
            kept.extend(group)
    return argv, kept


def without_spec_config(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in ("--speculative-config", "-sc"):
            skip = True
        elif not token.startswith("--speculative-config="):
            out.append(token)
    return out


@settings(max_examples=300, deadline=None)
@given(command_lines(), st.none() | spec_configs())
def test_render_round_trips_is_idempotent_and_keeps_other_args(
    line: tuple[list[str], list[str]], spec: SpecConfig | None
) -> None:
    argv, kept = line
    out = render_vllm_args(argv, spec)
    assert render_vllm_args(out, spec) == out
    parsed = parse_vllm_args(out)
    assert parsed.spec == spec
    assert parsed.notes == ()
    assert without_spec_config(out) == kept
    assert sum(token.startswith(("--speculative-config", "-sc")) for token in out) == (
        0 if spec is None else 1
    )


@settings(max_examples=200, deadline=None)
@given(spec_configs())
def test_json_round_trips(spec: SpecConfig) -> None:
    assert SpecConfig.from_json(spec.to_json()) == spec
    assert SpecConfig.from_json(spec.to_json()).to_json() == spec.to_json()
