"""Wall time of `spectune diagnose` on a 10-pod page set, against the CLI's bare start-up.

Run: python3 benchmarks/diagnose_speed.py [--pods 10] [--repeat 5]
Prints the median wall time of (a) `spectune --version` (interpreter + imports: the
baseline), (b) `spectune diagnose --json` on N pods' before/after pages with a baseline
set, and (c) the same work in-process (parse + window + diagnose), and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from spectune.diagnose import diagnose
from spectune.metrics import observation_from_pages, parse_page

PAGES = Path(str(resources.files("spectune") / "examples" / "pages"))


def _copies(example: str, moment: str, pods: int, out: Path) -> list[str]:
    src = sorted((PAGES / example / moment).glob("*.prom"))
    paths = []
    for i in range(pods):
        dst = out / f"{example}-{moment}-{i}.prom"
        dst.write_text(src[i % len(src)].read_text())
        paths.append(str(dst))
    return paths


def _time(cmd: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    """Measure and print the three figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        files = {
            (ex, m): _copies(ex, m, args.pods, out)
            for ex in ("vllm-eagle3-k7", "vllm-off")
            for m in ("before", "after")
        }
        cli = [sys.executable, "-m", "spectune.cli"]
        diag = [
            *cli, "diagnose", "--json", "--window", "600",
            "--before", *files["vllm-eagle3-k7", "before"],
            "--after", *files["vllm-eagle3-k7", "after"],
            "--baseline-before", *files["vllm-off", "before"],
            "--baseline-after", *files["vllm-off", "after"],
        ]  # fmt: skip
        startup = _time([*cli, "--version"], args.repeat)
        whole = _time(diag, args.repeat)
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            obs = {
                key: [parse_page(Path(p).read_text(), f"pod-{i}") for i, p in enumerate(paths)]
                for key, paths in files.items()
            }
            spec = observation_from_pages(
                obs["vllm-eagle3-k7", "before"], obs["vllm-eagle3-k7", "after"], 600
            )
            base = observation_from_pages(obs["vllm-off", "before"], obs["vllm-off", "after"], 600)
            diagnose(spec, base)
            runs.append(time.perf_counter() - t0)
        inproc = statistics.median(runs)
    print(f"pods: {args.pods} (+{args.pods} baseline), pages: {4 * args.pods}")
    print(f"spectune --version (start-up baseline): {startup * 1e3:8.1f} ms")
    ratio = whole / startup
    print(f"spectune diagnose --json:               {whole * 1e3:8.1f} ms  ({ratio:.2f}× start-up)")
    print(f"in-process parse+window+diagnose:       {inproc * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
