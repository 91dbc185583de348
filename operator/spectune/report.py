"""``spectune report``: PNG plots and an HTML page of a diagnosis.

Called by ``spectune report`` and by ``spectune demo``. Two plots: the per-position
acceptance curve with interval bars, and the predicted speedup against k with the model's
optimum marked. matplotlib runs headless (Agg); nothing is shown on screen.

The diagnosis predicts a *mean* per-token speedup from acceptance and draft cost; a search
ranks arms by the SpecTuning's objective (a p95, a throughput), which can favour another k
(the tail of the per-token latency grows with k faster than its mean). When a search's
:class:`Choice` is given (``spectune demo``), the page leads with the arm it chose and its
gain on the objective as the search measured it (the ``SPEEDUP`` a cluster shows), the
speedup plot draws the measured curve beside the model's, the findings are those of the
chosen arm itself, and no other draft length is put forward as the answer: the page and the
search tell one story.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spectune.diagnose import Diagnosis
from spectune.errors import SpecTuneError

try:
    import matplotlib
except ModuleNotFoundError as exc:  # the operator image installs spectune without the extra
    raise SpecTuneError(
        "plotting needs matplotlib, which a plain `pip install spectune` (and the operator "
        "image) leaves out: pip install 'spectune[plot]'"
    ) from exc

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

__all__ = ["ArmPoint", "Choice", "search_plot", "write_report"]


@dataclass(frozen=True)
class Choice:
    """The arm a search chose and what it measured on its objective.

    ``gain_over_off`` and ``measured_gain_by_k`` are the objective's gain over speculation
    off (off's p95 / the arm's for a latency, the arm's / off's for a throughput), from
    static runs of each arm on the same traffic (``source`` says which).
    """

    arm: str
    k: int | None
    """The chosen draft length; None for off or a per-batch-size schedule."""
    objective: str
    gain_over_off: float
    measured_gain_by_k: Mapping[int, float] = field(default_factory=dict)
    source: str = ""
    speedup: float | None = None
    """The arm's gain over off as the search measured it: what ``SPEEDUP`` shows
    (``spectune.k8s.projection.applied_speedup``); None where the search did not measure both."""
    tolerance: float | None = None
    """The search's epsilon: arms within this fraction of the best are tied for it."""


def _acceptance_plot(d: Diagnosis, path: Path) -> None:
    acc = d.acceptance
    pos = list(range(1, len(acc.per_position) + 1))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    if acc.per_position_low is not None and acc.per_position_high is not None:
        lower = [p - lo for p, lo in zip(acc.per_position, acc.per_position_low, strict=True)]
        upper = [hi - p for p, hi in zip(acc.per_position, acc.per_position_high, strict=True)]
        ax.errorbar(pos, acc.per_position, yerr=[lower, upper], fmt="o-", capsize=4,
                    label="P(L ≥ i), 95% Wilson interval")  # fmt: skip
    else:
        ax.plot(pos, acc.per_position, "o--", label="P(L ≥ i), modelled (flat rate)")
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(accepted length ≥ i)")
    ax.set_ylim(0, 1)
    ax.set_xticks(pos)
    ax.set_title(f"Acceptance by position — {d.engine.value}, k = {d.current_k}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _speedup_plot(d: Diagnosis, path: Path, choice: Choice | None = None) -> None:
    ks = [r.k for r in d.prediction]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    if all(r.speedup is not None for r in d.prediction):
        sp = [float(r.speedup or 0.0) for r in d.prediction]
        mean = " (mean per token)" if choice is not None else ""
        ax.plot(ks, sp, "o-", label=f"predicted speedup{mean}")
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        if d.best_k is not None:
            ax.plot([d.best_k], [sp[d.best_k]], "*", ms=16, color="tab:green",
                    label=f"model's peak, k = {d.best_k}{mean}")  # fmt: skip
        if choice is None and d.current_k < len(sp):
            ax.plot([d.current_k], [sp[d.current_k]], "s", ms=9, mfc="none", color="tab:red",
                    label=f"current k = {d.current_k}")  # fmt: skip
        if choice is not None:
            _choice_curve(ax, choice)
        ax.set_ylabel("speedup over no speculation")
    else:
        ax.plot(ks, [r.expected_tokens for r in d.prediction], "o-", label="tokens per pass")
        ax.set_ylabel("expected tokens per pass (draft cost unknown)")
    ax.set_xlabel("draft length k (0 = off)")
    ax.set_xticks(ks)
    ax.set_title("Speedup against k" + (": predicted mean, measured objective" if choice else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _choice_curve(ax: Axes, choice: Choice) -> None:
    """The objective's measured gain per k, and the chosen k, on the speedup plot."""
    by_k = {0: 1.0, **{k: g for k, g in choice.measured_gain_by_k.items() if math.isfinite(g)}}
    ks = sorted(by_k)
    ax.plot(ks, [by_k[k] for k in ks], "s-", color="tab:purple",
            label=f"{choice.objective} gain over off, measured")  # fmt: skip
    if choice.k is not None and math.isfinite(choice.gain_over_off):
        ax.plot([choice.k], [choice.gain_over_off], "D", ms=11, mfc="none", color="tab:red",
                label=f"chosen: {choice.arm}")  # fmt: skip


def _choice_html(d: Diagnosis, choice: Choice) -> str:
    """The page's lead: the search's choice and its gain on the objective, then what the static
    runs and the mean model say about the other draft lengths, each in the search's terms."""
    gain = choice.gain_over_off
    obj = html.escape(choice.objective)
    lead = f"<p><b>Chosen: {html.escape(choice.arm)}</b> on the objective <b>{obj}</b>"
    if choice.speedup is not None:
        lead += (
            f": SPEEDUP {choice.speedup:.2f}&times; over speculation off, as the search "
            "measured it (the gain <code>kubectl get spt</code> shows)"
        )
    lead += "."
    if math.isfinite(gain):
        lead += f" Checked by {html.escape(choice.source or 'static runs')}: {gain:.2f}&times;."
    lead += "</p>"
    measured = {k: g for k, g in choice.measured_gain_by_k.items() if math.isfinite(g)}
    if not measured or choice.k is None:
        return lead
    top = max(measured, key=lambda k: measured[k])
    if top == choice.k:
        lead += f"<p>In those runs k = {top} is this drafter's best on {obj} (purple curve).</p>"
    elif math.isfinite(gain) and gain > 0:
        ahead = measured[top] / gain - 1
        tol = choice.tolerance
        if tol is not None and ahead <= tol:
            lead += (
                f"<p>In those runs k = {top} came out {100 * ahead:.1f} % ahead of "
                f"k = {choice.k}, within the search's tolerance of {100 * tol:.0f} %: arms "
                "that close are tied for the best, and the search keeps the one it measured "
                "(purple curve).</p>"
            )
        else:
            lead += (
                f"<p>In those runs k = {top} came out {100 * ahead:.1f} % ahead of "
                f"k = {choice.k} (purple curve): the search did not find it.</p>"
            )
    if d.best_k is not None and d.best_k != choice.k:
        lead += (
            f"<p>The acceptance model below predicts the <i>mean</i> per-token speedup from "
            f"acceptance and draft cost, which peaks at k = {d.best_k} (green star). {obj} is "
            "read from the latency distribution, whose tail grows with k faster than its mean, "
            "so the measured curve ranks the draft lengths for this objective.</p>"
        )
    return lead


@dataclass(frozen=True)
class ArmPoint:
    """One arm as a search's decision saw it, on the objective relative to the incumbent.

    ``value``, ``low`` and ``high`` are the decision's estimate and its 95 % interval
    (``Decision.estimates``); ``measured`` says whether the arm ran on the canary or was
    predicted by the model; ``truth`` is the same ratio from static runs of both arms on the
    same traffic (NaN where no static run was made).
    """

    name: str
    value: float
    low: float
    high: float
    measured: bool
    truth: float = math.nan


def search_plot(
    points: list[ArmPoint], objective: str, minimise: bool, incumbent: str, path: Path
) -> Path:
    """Every arm's estimate with its interval, measured and predicted, and the static runs.

    One column per arm, ``off`` first and then each drafter by k; a filled dot is an arm the
    search measured on the canary, a hollow one an arm it predicted; a cross is what a
    static run of the arm gave. The line at 1 is the incumbent.
    """
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(points) + 2), 4))
    xs = list(range(len(points)))
    for x, p in zip(xs, points, strict=True):
        colour = "tab:blue" if p.measured else "tab:gray"
        ax.errorbar(
            x, p.value, yerr=[[p.value - p.low], [p.high - p.value]], fmt="o", color=colour,
            mfc=colour if p.measured else "white", capsize=3,
        )  # fmt: skip
        if math.isfinite(p.truth):
            ax.plot(x, p.truth, "x", color="tab:red", markersize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(xs, [p.name for p in points], rotation=60, ha="right", fontsize=8)
    better = "lower" if minimise else "higher"
    ax.set_ylabel(f"{objective} / {incumbent}'s ({better} is better)")
    ax.set_title(
        "the search's last decision: measured (filled) and predicted (hollow) arms, "
        "95 % intervals; × static run",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    d: Diagnosis, out: Path, choice: Choice | None = None, chosen: Diagnosis | None = None
) -> list[Path]:
    """Write the plots, ``diagnosis.json`` and ``index.html`` into ``out``; return the paths.

    With ``choice``, the page describes that arm on its objective first (module docstring);
    ``chosen`` is that arm's own diagnosis (``d`` may be of the drafter at another k, to
    price every k), whose findings the page lists and ``diagnosis.json`` keeps under
    ``chosen.findings``: what to do is said of the setting chosen, never of the one diagnosed.
    """
    out.mkdir(parents=True, exist_ok=True)
    acc_png, sp_png = out / "acceptance.png", out / "speedup.png"
    _acceptance_plot(d, acc_png)
    _speedup_plot(d, sp_png, choice)
    doc = d.to_json()
    findings = doc["findings"]
    if choice is not None:
        doc["chosen"] = {
            "arm": choice.arm,
            "k": choice.k,
            "objective": choice.objective,
            "speedup": choice.speedup,
            "gain_over_off": choice.gain_over_off if math.isfinite(choice.gain_over_off) else None,
            "measured_gain_by_k": {
                str(k): g for k, g in choice.measured_gain_by_k.items() if math.isfinite(g)
            },
            "source": choice.source,
            "tolerance": choice.tolerance,
        }
        if chosen is not None:
            findings = doc["chosen"]["findings"] = chosen.to_json()["findings"]
    (out / "diagnosis.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = "".join(
        f"<tr><td>{html.escape(f['code'])}</td><td>{html.escape(f['message'])}</td>"
        f"<td>{html.escape(f['action'])}</td></tr>"
        for f in findings
    )
    cost = doc["draft_cost"]
    if choice is None:
        summary = f"current k = {d.current_k}"
        best_k = f" Best k = {doc['best_k']}."
        findings_title = "Findings"
    else:
        # The model's peak is in the lead, in the search's terms; here it would read as the
        # answer beside the arm chosen.
        summary = (
            f"the drafter diagnosed at k = {d.current_k} (its largest: one window prices every k)"
        )
        best_k = ""
        on = choice.arm if chosen is not None else f"k = {d.current_k}"
        findings_title = (
            f"Findings on {html.escape(on)} against off (the diagnosis reads the mean "
            f"per-token latency, not {html.escape(choice.objective)})"
        )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>spectune report</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
td,th{{border:1px solid #ccc;padding:.3em .6em;vertical-align:top}}
table{{border-collapse:collapse}}</style>
</head><body>
<h1>spectune report</h1>
{_choice_html(d, choice) if choice is not None else ""}
<p>Engine <b>{html.escape(doc["engine"])}</b>, {len(doc["pods"])} pod(s), {summary}.
Acceptance rate {d.acceptance.rate:.3f}, mean accepted length
{d.acceptance.mean_accepted_length:.2f} tokens per pass.
Draft cost c = {cost["value"]} ({html.escape(cost["source"])}).{best_k}</p>
<h2>Acceptance by position</h2><img src="acceptance.png" alt="per-position acceptance">
<h2>Predicted speedup</h2><img src="speedup.png" alt="predicted speedup against k">
<h2>{findings_title}</h2><table><tr><th>code</th><th>what</th><th>do</th></tr>{rows}</table>
<p><a href="diagnosis.json">diagnosis.json</a></p>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return [acc_png, sp_png, out / "diagnosis.json", index]
