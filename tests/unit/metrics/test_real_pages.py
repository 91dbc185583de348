"""Public /metrics pages as users pasted them: what `spectune diagnose` tells about each.

Every page under tests/fixtures/pages names its source and version in its header. Each test
runs the command a new user runs on one saved page (`spectune diagnose --after PAGE`) and
checks what they would read: the engine and version found, k, acceptance, or a refusal
that names what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.cli import main

PAGES = Path(__file__).parents[2] / "fixtures" / "pages"


def diagnose_page(name: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert main(["diagnose", "--after", str(PAGES / name), *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def refusal(name: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["diagnose", "--after", str(PAGES / name), *extra]) == 3  # bad input
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune: error: ") and "\n" not in err
    return err


def test_every_fixture_page_names_its_source() -> None:
    pages = sorted(PAGES.glob("*.prom"))
    assert len(pages) >= 8
    for page in pages:
        head = page.read_text().splitlines()[0]
        assert head.startswith("# Source: "), page.name


def test_a_cut_vllm_fragment_runs_at_the_k_its_draft_tokens_show(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 4 per-position series, but 1.0218118e7 draft tokens over 2.04363e6 drafts = 5.00.
    doc = diagnose_page("vllm-v1-dgx-spark-spec-fragment.prom", capsys)
    assert doc["engine"] == "vllm" and doc["engine_version"].startswith("vLLM V1 engine, 0.8.5")
    assert doc["current"]["k"] == 5
    acc = doc["acceptance"]
    assert acc["mean_accepted_length"] == pytest.approx(1 + 7.268642e6 / 2.04363e6, rel=1e-6)
    assert acc["per_position"][:4] == pytest.approx(
        [v / 2.04363e6 for v in (1.883866e6, 1.732372e6, 1.489894e6, 1.204113e6)], rel=1e-6
    )
    # Position 5 holds what the four leave of the accepted total.
    assert acc["per_position"][4] == pytest.approx((7.268642e6 - 6.310245e6) / 2.04363e6, rel=1e-6)
    assert acc["per_position_source"] == "measured+modelled"
    assert any("positions are missing" in n for n in doc["notes"])


def test_k_above_every_count_on_the_page_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal("vllm-v1-dgx-spark-spec-fragment.prom", capsys, "--k", "7")
    assert "--k 7 is more than the 4 per-position series" in err and "k = 5" in err


def test_a_fragment_without_accepted_tokens_is_refused_naming_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal("vllm-pr41916-created-gauges-fragment.prom", capsys)
    assert "vLLM V1 engine" in err
    assert "not vllm:spec_decode_num_accepted_tokens_total" in err
    assert "save the whole /metrics page" in err


def test_an_unprefixed_trtllm_page_is_tensorrt_llm_without_speculation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal("trtllm-aibrix2004-unprefixed.prom", capsys)
    assert "TensorRT-LLM" in err and "without the trtllm_ prefix" in err
    assert "not from a serving engine" not in err
    assert "trtllm_spec_decode_num_draft_tokens_total" in err and "speculation is off" in err


def test_an_sglang_page_behind_a_router_that_rewrote_colons_is_sglang(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal("sglang-smg813-underscore-prefix.prom", capsys)
    assert err.startswith("spectune: error: SGLang") and "names spelled sglang_" in err
    assert "sglang:spec_accept_length" in err and "speculation is off" in err


@pytest.mark.parametrize(
    ("page", "version"),
    [
        ("sglang-13485-v0.5.1.prom", "tp_rank/pp_rank"),
        ("sglang-pr4444-2025-03.prom", "SGLang, version not told"),
        ("sglang-pr1853-v0.3-name-label.prom", "label 'name' instead of 'model_name'"),
    ],
)
def test_sglang_pages_without_speculation_say_so_not_that_k_is_unknown(
    page: str, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refusal(page, capsys)
    assert version in err and "speculation is off" in err
    assert "--enable-metrics and a --speculative-algorithm" in err
    assert "cannot tell the draft length" not in err


def test_the_draft_engines_own_gauges_are_not_averaged_into_the_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = diagnose_page("sglang-draft-engine-gauges.prom", capsys)
    assert doc["acceptance"]["mean_accepted_length"] == pytest.approx(2.8)  # not 2.75
    assert doc["acceptance"]["rate"] == pytest.approx(0.6)
    assert doc["current"]["k"] == 3  # (2.8 - 1) / 0.6


def test_sglang_counters_that_cannot_be_one_drafter_fall_back_to_the_gauges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 18000 generated over 40 verifications is 450 tokens a pass, above the 10 it verifies.
    doc = diagnose_page("sglang-verify-calls-fixture.prom", capsys)
    assert doc["acceptance"]["mean_accepted_length"] == pytest.approx(2.5)
    assert doc["current"]["k"] == 9  # spec_num_draft_tokens 10 = the root + 9 drafts
    assert any("450.00, above the 10 tokens a pass verifies" in n for n in doc["notes"])


def test_a_v0_page_is_v0_by_a_family_only_v0_had(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal("vllm-8819-v0-0.6.prom", capsys)
    assert "vLLM V0 engine" in err and "not from a serving engine" not in err
    assert "vllm:spec_decode_draft_acceptance_rate" in err and "--disable-log-stats" in err
