"""Rich terminal views of a diagnosis and of the what-if table.

Called by the CLI only. Everything shown is also in the ``--json`` document; the terminal
view adds the per-position curve as bars, marks the optimum, and colours the findings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from spectune.diagnose import Code, Diagnosis, PredictionRow

__all__ = ["countdown", "render_diagnosis", "render_whatif"]

_BAD = {
    Code.LOW_ACCEPTANCE,
    Code.DRAFTER_TOO_EXPENSIVE,
    Code.K_PAST_PEAK,
    Code.KV_POOL_SHRANK,
    Code.DRAFTER_BROKEN,
    Code.POD_ACCEPTANCE_DECAY,
}
_STYLE = {Code.HEALTHY: "green", Code.INSUFFICIENT_DATA: "yellow"}


def _bar(p: float, width: int = 30) -> str:
    n = max(0, min(width, round(p * width)))
    return "█" * n + "·" * (width - n)


def _prediction_table(rows: Sequence[PredictionRow], best_k: int | None, current_k: int) -> Table:
    t = Table(title="Predicted speedup per draft length", title_justify="left")
    t.add_column("k", justify="right")
    t.add_column("tokens / pass", justify="right")
    t.add_column("speedup", justify="right")
    t.add_column("")
    for r in rows:
        mark = []
        if r.k == best_k:
            mark.append("◀ best")
        if r.k == current_k:
            mark.append("(current)")
        sp = "—" if r.speedup is None else f"{r.speedup:.2f}×"
        style = "bold green" if r.k == best_k else None
        label = "off" if r.k == 0 else str(r.k)
        t.add_row(label, f"{r.expected_tokens:.2f}", sp, " ".join(mark), style=style)
    return t


async def countdown(
    console: Console,
    seconds: float,
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait ``seconds``, showing on a terminal how long is left before ``what``.

    The wait ends by the clock, not by counting ticks, so the window is as long as asked
    however late each tick wakes. On a pipe or a file (CI, ``2>log``) nothing is drawn: a
    progress bar there is noise.
    """
    end = clock() + seconds
    if not console.is_terminal:
        await sleep(seconds)
        return
    from rich.progress import BarColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[left]}"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"window of {seconds:g}s, then {what}", total=seconds, left="")
        while (left := end - clock()) > 0:
            bar.update(task, completed=seconds - left, left=f"{left:.0f}s left")
            await sleep(min(1.0, left))
        bar.update(task, completed=seconds, left="0s left")


def render_whatif(
    console: Console, acceptance: float, cost: float, rows: Sequence[PredictionRow], best_k: int
) -> None:
    """Print the what-if table for a flat acceptance and a draft cost."""
    console.print(
        f"What if: per-token acceptance a = {acceptance:g}, draft cost c = {cost:g} target steps"
    )
    console.print(_prediction_table(rows, best_k, current_k=-1))
    console.print(f"Best k = {best_k}" if best_k else "Speculation does not pay at this cost.")


def render_diagnosis(console: Console, d: Diagnosis) -> None:
    """Print a diagnosis: acceptance curve, cost, prediction, findings."""
    acc = d.acceptance
    window = f"{d.window_s:g}s" if d.window_s else "unknown window"
    head = Text.assemble(
        ("spectune diagnose", "bold"),
        f"  engine {d.engine.value} · {len(d.pods)} pod(s) · {window} · current k = {d.current_k}",
    )
    curve = Table(title=f"Acceptance by position ({acc.per_position_source})", title_justify="left")
    curve.add_column("position", justify="right")
    curve.add_column("P(L ≥ i)", justify="right")
    curve.add_column("95% interval", justify="right")
    curve.add_column("")
    for i, p in enumerate(acc.per_position):
        band = "—"
        if acc.per_position_low is not None and acc.per_position_high is not None:
            band = f"{acc.per_position_low[i]:.3f}–{acc.per_position_high[i]:.3f}"
        curve.add_row(str(i + 1), f"{p:.3f}", band, _bar(p))
    drafts = f"{acc.drafts:,.0f} drafts" if acc.drafts is not None else "gauges only"
    summary = Text(
        (f"{d.engine_version}\n" if d.engine_version else "")
        + f"acceptance rate {acc.rate:.3f} · mean accepted length {acc.mean_accepted_length:.2f} "
        f"tokens/pass · {drafts}"
    )
    c = d.draft_cost
    cost = Text(
        f"draft cost c = {c.value:.3f} ({c.source}: {c.detail})"
        if c.value is not None
        else f"draft cost c unknown ({c.detail})"
    )
    measured = Text("")
    if d.measured_speedup is not None and d.measured_speedup_interval is not None:
        ci = d.measured_speedup_interval
        measured = Text(
            f"measured speedup vs baseline {d.measured_speedup:.2f}× "
            f"({ci.low:.2f}–{ci.high:.2f}, {ci.confidence:.0%})"
        )
    findings = Table(show_header=True, title="Findings", title_justify="left")
    findings.add_column("code")
    findings.add_column("what")
    findings.add_column("do")
    for f in d.findings:
        style = "red" if f.code in _BAD else _STYLE.get(f.code, "cyan")
        findings.add_row(Text(f.code.value, style=style), f.message, f.action)
    notes = Text("\n".join(f"note: {n}" for n in d.notes), style="dim")
    console.print(
        Panel(
            Group(
                summary,
                curve,
                cost,
                measured,
                _prediction_table(d.prediction, d.best_k, d.current_k),
                findings,
                notes,
            ),
            title=head,
        )
    )
