"""``spectune run --log-level/--log-format``: what the operator writes to its log, and how.

The chart passes ``operator.logLevel`` and ``operator.logFormat`` as these flags; a log pipeline
(Loki, Elasticsearch) reads the JSON lines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from spectune.cli import main
from spectune.errors import SpecError
from spectune.handlers import configure_logging


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_format_writes_one_json_object_a_line_at_the_chosen_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("warning", "json")
    log = logging.getLogger("spectune.test")
    log.info("not at warning level")
    log.warning("canary %s is not ready", "llama-70b-spectune-canary")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["message"] == "canary llama-70b-spectune-canary is not ready"
    assert record["severity"] == "warn"  # kopf's name for it


def test_plain_format_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("debug", "plain")
    logging.getLogger("spectune.test").debug("a debug line")
    assert capsys.readouterr().err.strip() == "a debug line"


def test_error_level_hides_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("error", "full")
    logging.getLogger("spectune.test").warning("hidden")
    logging.getLogger("spectune.test").error("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and "shown" in err and "[ERROR" in err


def test_unknown_level_or_format_is_refused_by_name() -> None:
    with pytest.raises(SpecError, match="log format 'xml': use one of full, plain, json"):
        configure_logging("info", "xml")
    with pytest.raises(SpecError, match="log level 'loud': use one of debug"):
        configure_logging("loud", "full")


def test_run_refuses_an_unknown_format_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--log-format", "xml"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--log-format: invalid choice: 'xml'" in err and "'json'" in err
