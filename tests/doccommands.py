"""Every shell command in the user docs, and which test runs it.

The README and ``docs/*.md`` tell users what to type. This module extracts every command from
their fenced ``sh``/``bash`` code blocks (continuation lines joined, comments dropped, ``a && b``
split; a trailing ``# or: CMD`` comment is an alternative command) and keeps the one registry,
:data:`COVERAGE`, of how each is exercised:

* ``unit``: run offline by ``tests/unit/docs/test_doc_commands.py`` (must exit 0);
* ``prometheus``: run against a real Prometheus scraping simulated vLLM pods by
  ``tests/integration/docs/test_doc_commands.py``;
* ``cluster``: run against the real test API server (kwok runs the pods) by the same module;
* ``e2e``: run by ``tests/e2e/test_playground.py`` (the playground of docs/try-it.md), which
  checks that it ran every command of this tier;
* ``ci``: run by ``.ci/run`` itself (``tests/unit/docs`` checks that it is).

A command in the docs that is not in :data:`COVERAGE` fails ``tests/unit/docs`` with its text;
a ``cluster`` or ``prometheus`` command that the integration test did not run fails that test
with its text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
SHELL_FENCES = {"sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class DocCommand:
    """One command as a user would type it, and where the docs show it."""

    text: str
    doc: str
    line: int
    comment: str = ""  # the comment after it, e.g. the output it promises

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _strip_comment(line: str) -> tuple[str, str]:
    """Split ``line`` into (command, comment) at the first ``#`` outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def _fenced_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(first line number, info string, lines) of every fenced code block."""
    blocks: list[tuple[int, str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)\s*(\S*)", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).lower(), i + 1
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((start + 1, info, body))
        i += 1
    return blocks


def output_blocks(path: Path) -> list[tuple[int, list[str]]]:
    """Fenced blocks without a language: sample output (e.g. ``kubectl get spt``)."""
    return [(n, body) for n, info, body in _fenced_blocks(path.read_text()) if not info]


def extract(path: Path) -> list[DocCommand]:
    """Every command in the shell code blocks of ``path``, in order."""
    doc = str(path.relative_to(REPO))
    out: list[DocCommand] = []
    for first, info, body in _fenced_blocks(path.read_text()):
        if info not in SHELL_FENCES:
            continue
        pending, pending_line, comments = "", 0, []
        for offset, raw in enumerate(body):
            code, comment = _strip_comment(raw.strip())
            if comment:
                comments.append(comment)
            if not pending:
                pending_line = first + offset
            continued = code.endswith("\\")
            pending += " " + code.removesuffix("\\").strip()
            if continued:
                continue
            full = " ".join(pending.split())
            pending = ""
            note = " ".join(comments)
            comments = []
            for part in (p.strip() for p in full.split(" && ")):
                if part:
                    out.append(DocCommand(part, doc, pending_line, note))
            alt = re.match(r"^or:\s*(.+)$", note)
            if alt:
                out.append(DocCommand(alt.group(1).strip(), doc, pending_line))
    return out


def all_commands() -> list[DocCommand]:
    """Every command of README.md and docs/*.md."""
    return [c for path in DOCS for c in extract(path)]


@dataclass(frozen=True)
class Coverage:
    """Which tier runs a command, and how (the variant, when not the exact text)."""

    tier: str  # unit | prometheus | cluster | e2e | ci
    how: str


_EXACT = "run exactly as written"

COVERAGE: dict[str, Coverage] = {
    # --- offline: tests/unit/docs ---------------------------------------------------------------
    "spectune demo": Coverage("unit", _EXACT + " (the embedded default scenario, ~5 s)"),
    "spectune demo --scenario examples/scenarios/summarize-ngram.yaml": Coverage("unit", _EXACT),
    "spectune sim run --scenario examples/scenarios/chat-eagle3.yaml --arm eagle3/3 --json": (
        Coverage("unit", _EXACT)
    ),
    "spectune bench --scenario examples/scenarios/load-ramp.yaml --policy spectune --json": (
        Coverage("unit", _EXACT)
    ),
    "python3 benchmarks/bench_all.py": Coverage(
        "unit",
        "short variant: the same script on one scenario and two policies "
        "(the full table takes minutes)",
    ),
    "python3 benchmarks/seeds.py": Coverage(
        "unit",
        "short variant: the same script on one scenario and its own seed (the full sweep "
        "takes minutes with the oracles cached, about twenty without)",
    ),
    "spectune sim sample --family benchmarks/families/realistic.yaml --seed 1 --count 5 "
    "--out worlds/": Coverage("unit", _EXACT),
    "python3 benchmarks/family.py --set quick --compare initial,spectune --out family/": Coverage(
        "unit",
        "short variant: the same script on the tests' tiny family (two 15-minute worlds); the "
        "quick set takes about an hour on two cores before its oracles are cached",
    ),
    "spectune whatif --acceptance 0.7 --draft-cost 0.15": Coverage(
        "unit", _EXACT + "; the best k and speedup the README's comment promises are checked"
    ),
    "spectune diagnose --before a0.prom b0.prom --after a1.prom b1.prom "
    "--baseline-before off0.prom --baseline-after off1.prom --window 10m": Coverage(
        "unit", _EXACT + ", on the bundled example pages saved under those names"
    ),
    "spectune diagnose --after pod0.prom": Coverage(
        "unit", _EXACT + ", on a public page saved under that name (tests/fixtures/pages)"
    ),
    "spectune report --example --out report/": Coverage("unit", _EXACT),
    "promtool test rules deploy/alerts/spectune-rules.test.yaml": Coverage("unit", _EXACT),
    "python -m spectune.run": Coverage(
        "unit",
        "variant: with --help (the operator itself is started as `spectune run` by the "
        "cluster test and as `python -m spectune.run` by tests/integration/operator)",
    ),
    "docker build -t spectune:0.1.0 .": Coverage(
        "unit",
        "replayed: no container engine here; tests/unit/packaging/test_dockerfile.py checks the "
        "Dockerfile and replays its build stage into a clean venv",
    ),
    # --- a real Prometheus scraping simulated vLLM pods: tests/integration/docs ---------------
    "spectune diagnose --scrape http://10.0.0.7:8000/metrics http://10.0.0.8:8000/metrics "
    "--window 60s": Coverage(
        "prometheus", "the two URLs are simulated vLLM pods on loopback; --window 60s -> 5s"
    ),
    "spectune diagnose --prometheus http://prometheus.monitoring:9090 "
    '--selector \'{namespace="llm",pod=~"llama-.*"}\' '
    '--baseline-selector \'{namespace="llm",pod=~"nospec-llama-.*"}\' --window 10m': Coverage(
        "prometheus",
        "the URL is the test Prometheus, which scrapes simulated pods so labelled (namespace "
        "docs-llm, as other tests label pods llm)",
    ),
    "spectune diagnose --prometheus http://prometheus.monitoring:9090 "
    '--selector \'{namespace="llm",pod=~"llama-.*"}\' --window 10m': Coverage(
        "prometheus",
        "the URL is the test Prometheus, which scrapes simulated pods so labelled (namespace "
        "docs-llm, as other tests label pods llm)",
    ),
    # --- the real test API server: tests/integration/docs ------------------------------------
    "kubectl apply -f crds/ -f deploy/rbac.yaml": Coverage("cluster", _EXACT),
    "helm install spectune charts/spectune -n spectune-system --create-namespace": Coverage(
        "cluster", _EXACT
    ),
    "helm install spectune charts/spectune --namespace spectune-system --create-namespace": (
        Coverage("cluster", _EXACT)
    ),
    "kubectl -n spectune-system rollout status deployment/spectune": Coverage("cluster", _EXACT),
    "spectune run": Coverage("cluster", _EXACT + " (the operator, with the admin kubeconfig)"),
    "kubectl apply -f examples/spectuning.yaml": Coverage(
        "cluster", _EXACT + ", on the example edited as the walkthrough says"
    ),
    "kubectl get spt": Coverage("cluster", _EXACT + "; the columns in its comment are checked"),
    "kubectl apply -n llm -f examples/spectuning.yaml": Coverage(
        "cluster",
        _EXACT + ", on the example edited as the walkthrough says, with search.window 30s",
    ),
    "kubectl get spt -n llm -w": Coverage(
        "cluster", _EXACT + " for a few seconds; the walkthrough's header and Baseline row"
    ),
    "kubectl get events -n llm --field-selector involvedObject.name=llama-70b": Coverage(
        "cluster", _EXACT
    ),
    "kubectl get deploy -n llm -l spectune.io/role=canary": Coverage("cluster", _EXACT),
    "kubectl get spt -n llm llama-70b -o yaml": Coverage("cluster", _EXACT),
    "kubectl get spt -A": Coverage("cluster", _EXACT + "; the columns in its comment are checked"),
    "kubectl describe spt -n llm llama-70b": Coverage("cluster", _EXACT),
    'kubectl patch spt -n llm llama-70b --type merge -p \'{"spec":{"suspend":true}}\'': (
        Coverage("cluster", _EXACT + "; the phase turns Suspended")
    ),
    'kubectl patch spt -n llm llama-70b --type merge -p \'{"spec":{"suspend":false}}\'': (
        Coverage("cluster", _EXACT + "; the phase leaves Suspended")
    ),
    "kubectl delete spt -n llm llama-70b": Coverage(
        "cluster", _EXACT + "; the target keeps its setting"
    ),
    "helm uninstall spectune -n spectune-system": Coverage("cluster", _EXACT),
    # --- the playground: tests/e2e/test_playground.py ------------------------------------------
    'eval "$(spectune playground up)"': Coverage(
        "e2e", "with --dir and --time-scale 60; its stdout is exactly the export lines it evals"
    ),
    "spectune status llm/llama-70b": Coverage("e2e", _EXACT + ", with up's KUBECONFIG"),
    "spectune playground down": Coverage("e2e", "with --dir; every process and port is freed"),
    # --- .ci/run --------------------------------------------------------------------------------
    "python3 -m pip install -e '.[plot]'": Coverage(
        "ci", "hack/test.sh installs the checkout (-e, its test extra includes plot)"
    ),
    "bash hack/test.sh": Coverage("ci", ".ci/run is exactly this command"),
}


def commands_of(tier: str) -> dict[str, Coverage]:
    """The registry's commands run by ``tier``."""
    return {text: cov for text, cov in COVERAGE.items() if cov.tier == tier}
