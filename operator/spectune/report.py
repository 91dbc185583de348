"""``spectune report``: PNG plots and an HTML page of a diagnosis.

Called by the CLI (and by ``spectune demo`` later). Two plots: the per-position
acceptance curve with interval bars, and the predicted speedup against k with the optimum
marked. matplotlib runs headless (Agg); nothing is shown on screen.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spectune.diagnose import Diagnosis

__all__ = ["write_report"]


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


def _speedup_plot(d: Diagnosis, path: Path) -> None:
    ks = [r.k for r in d.prediction]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    if all(r.speedup is not None for r in d.prediction):
        sp = [float(r.speedup or 0.0) for r in d.prediction]
        ax.plot(ks, sp, "o-", label="predicted speedup")
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        if d.best_k is not None:
            ax.plot([d.best_k], [sp[d.best_k]], "*", ms=16, color="tab:green",
                    label=f"best k = {d.best_k}")  # fmt: skip
        if d.current_k < len(sp):
            ax.plot([d.current_k], [sp[d.current_k]], "s", ms=9, mfc="none", color="tab:red",
                    label=f"current k = {d.current_k}")  # fmt: skip
        ax.set_ylabel("speedup over no speculation")
    else:
        ax.plot(ks, [r.expected_tokens for r in d.prediction], "o-", label="tokens per pass")
        ax.set_ylabel("expected tokens per pass (draft cost unknown)")
    ax.set_xlabel("draft length k (0 = off)")
    ax.set_xticks(ks)
    ax.set_title("Predicted speedup against k")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(d: Diagnosis, out: Path) -> list[Path]:
    """Write the plots, ``diagnosis.json`` and ``index.html`` into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    acc_png, sp_png = out / "acceptance.png", out / "speedup.png"
    _acceptance_plot(d, acc_png)
    _speedup_plot(d, sp_png)
    doc = d.to_json()
    (out / "diagnosis.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = "".join(
        f"<tr><td>{html.escape(f['code'])}</td><td>{html.escape(f['message'])}</td>"
        f"<td>{html.escape(f['action'])}</td></tr>"
        for f in doc["findings"]
    )
    cost = doc["draft_cost"]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>spectune report</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
td,th{{border:1px solid #ccc;padding:.3em .6em;vertical-align:top}}
table{{border-collapse:collapse}}</style>
</head><body>
<h1>spectune report</h1>
<p>Engine <b>{html.escape(doc["engine"])}</b>, {len(doc["pods"])} pod(s), current k = {d.current_k}.
Acceptance rate {d.acceptance.rate:.3f}, mean accepted length
{d.acceptance.mean_accepted_length:.2f} tokens per pass.
Draft cost c = {cost["value"]} ({html.escape(cost["source"])}). Best k = {doc["best_k"]}.</p>
<h2>Acceptance by position</h2><img src="acceptance.png" alt="per-position acceptance">
<h2>Predicted speedup</h2><img src="speedup.png" alt="predicted speedup against k">
<h2>Findings</h2><table><tr><th>code</th><th>what</th><th>do</th></tr>{rows}</table>
<p><a href="diagnosis.json">diagnosis.json</a></p>
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return [acc_png, sp_png, out / "diagnosis.json", index]
