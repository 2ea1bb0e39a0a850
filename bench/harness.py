"""A tiny benchmark harness: every figure sits beside a baseline from the same run.

A bench module is ``bench/bench_<name>.py`` with ``run(report: Report) -> None``; it
measures its figure and its baseline in the same process, back to back, and calls
``report.add(...)``. Absolute numbers swing with the machine's load (fsync latency
alone moves 10x); the ratio column is what to compare across runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Row:
    group: str
    figure: str
    value: float
    baseline_name: str
    baseline: float
    unit: str
    higher_is_better: bool = True
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float:
        if not self.baseline:
            return float("nan")
        return self.value / self.baseline


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    quick: bool = False
    # Further tables a module prints after the main one (e.g. the peers' figures).
    sections: list[str] = field(default_factory=list)

    def add(self, **kwargs) -> Row:
        row = Row(**kwargs)
        self.rows.append(row)
        print(
            f"  {row.group}: {row.figure} = {fmt(row.value)} {row.unit} "
            f"(baseline {fmt(row.baseline)}, ratio {row.ratio:.2f})",
            flush=True,
        )
        return row

    def table(self) -> str:
        headers = [
            "group",
            "figure",
            "value",
            "baseline",
            "baseline value",
            "unit",
            "ratio",
            "target",
        ]
        lines = [headers]
        for r in self.rows:
            lines.append(
                [
                    r.group,
                    r.figure,
                    fmt(r.value),
                    r.baseline_name,
                    fmt(r.baseline),
                    r.unit,
                    f"{r.ratio:.2f}",
                    r.target or "(diagnostic)",
                ]
            )
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(headers))]
        out = []
        for n, line in enumerate(lines):
            out.append(
                "| "
                + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True))
                + " |"
            )
            if n == 0:
                out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(out)


def fmt(x: float) -> str:
    if x != x:  # nan
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.4f}"


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` calls, in milliseconds."""
    return interleaved_ms({"fn": fn}, repeat)["fn"]


def interleaved_ms(
    fns: dict[str, Callable[[], object]], repeat: int, *, warmup: int = 0
) -> dict[str, float]:
    """Median wall time in milliseconds of each of ``fns``, called in turn.

    Each round calls every function once, in order, so a swing in the machine's
    load hits all of them alike. The first ``warmup`` rounds are not timed.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for n in range(warmup + repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if n >= warmup:
                times[name].append(elapsed)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}
