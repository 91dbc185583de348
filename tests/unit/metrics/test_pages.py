"""Reading /metrics pages: dialects, bad pages, and a fuzzed parser that never crashes."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.engines import Dialect
from spectune.errors import InputError
from spectune.metrics import parse_page

PAGES = Path(str(resources.files("spectune") / "examples" / "pages"))


@pytest.mark.parametrize(
    ("example", "dialect"),
    [
        ("vllm-eagle3-k7", Dialect.VLLM_V1),
        ("vllm-off", Dialect.VLLM_V1),
        ("vllm-v0-k4", Dialect.VLLM_V0),
        ("sglang-eagle3", Dialect.SGLANG),
        ("trtllm-eagle3-k3", Dialect.TRTLLM),
    ],
)
def test_each_bundled_page_is_read_as_its_engine(example: str, dialect: Dialect) -> None:
    page = parse_page((PAGES / example / "after" / "pod-0.prom").read_text())
    assert page.dialect is dialect


def test_counters_keep_their_total_suffix_and_labels() -> None:
    page = parse_page((PAGES / "vllm-eagle3-k7" / "after" / "pod-0.prom").read_text())
    per_pos = page.series("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert sorted(s.label("position") for s in per_pos) == [str(i) for i in range(7)]
    assert all(s.label("model_name") == "meta-llama/Llama-3.1-70B-Instruct" for s in per_pos)
    assert page.has("vllm:request_time_per_output_token_seconds_bucket")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   \n\n", "empty"),
        ("<html><body>Login</body></html>", "not a valid Prometheus exposition page"),
        ('vllm:num_requests_running{engine="0" 1\n', "not a valid Prometheus exposition page"),
        ("vllm:num_requests_running one\n", "not a valid Prometheus exposition page"),
        ("# only a comment\n", "holds no samples"),
        (
            '# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0"} 12\n',
            "not from a serving engine",
        ),
    ],
)
def test_a_bad_page_is_a_one_line_input_error(text: str, reason: str) -> None:
    with pytest.raises(InputError, match=reason) as info:
        parse_page(text, pod="pod-3")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("pod-3:") or "serving engine" in message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_is_a_page_or_an_input_error(text: str) -> None:
    try:
        page = parse_page(text)
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert page.samples


_name = st.sampled_from(
    ["vllm:num_requests_running", "vllm:spec_decode_num_drafts_total", "sglang:spec_accept_length"]
)
_line = st.builds(
    lambda n, lab, v: f'{n}{{engine="{lab}"}} {v}',
    _name,
    st.text(alphabet='0123456789ab"\\{}=, ', max_size=6),
    st.one_of(st.floats(allow_nan=True), st.text(max_size=5)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_line, min_size=1, max_size=8))
def test_mangled_engine_lines_are_a_page_or_an_input_error(lines: list[str]) -> None:
    try:
        parse_page("\n".join(lines) + "\n")
    except InputError as exc:
        assert "\n" not in str(exc)
