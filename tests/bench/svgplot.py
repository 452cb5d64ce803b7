"""A small line chart as SVG, with no plotting library (the curves of ``curves.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 640, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60

Series = tuple[str, Sequence[tuple[float, float]]]


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / 5))
    for mult in (1, 2, 5, 10):
        if span / (step * mult) <= 6:
            step *= mult
            break
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 2)]


def _label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def line_chart(
    path: Path,
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    y_from_zero: bool = True,
) -> None:
    """Write ``series`` (name, [(x, y), …]) as one SVG chart at ``path``."""
    points = [p for _, values in series for p in values]
    if not points:
        return
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    x_ticks = _ticks(min(xs), max(xs), log_x)
    y_ticks = _ticks(0.0 if y_from_zero else min(ys), max(ys) * 1.05, False)
    x_lo, x_hi = x_ticks[0], x_ticks[-1]
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        if log_x:
            return LEFT + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (
                W - LEFT - RIGHT
            )
        return LEFT + (x - x_lo) / ((x_hi - x_lo) or 1) * (W - LEFT - RIGHT)

    def sy(y: float) -> float:
        return H - BOTTOM - (y - y_lo) / ((y_hi - y_lo) or 1) * (H - TOP - BOTTOM)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    for t in x_ticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{_label(t)}</text>')
    for t in y_ticks:
        y = sy(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(t)}</text>')
    axes = f"{LEFT},{TOP} {LEFT},{H - BOTTOM} {W - RIGHT},{H - BOTTOM}"
    out.append(f'<polyline points="{axes}" fill="none" stroke="black"/>')
    out.append(f'<text x="{W / 2}" y="{H - 18}" text-anchor="middle">{escape(x_label)}</text>')
    turn = f"rotate(-90 16 {H / 2})"
    out.append(f'<text x="16" y="{H / 2}" text-anchor="middle" transform="{turn}">{escape(y_label)}</text>')
    for n, (name, values) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values))
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in values:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 8 + n * 16
        out.append(f'<rect x="{LEFT + 10}" y="{ly - 8}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{LEFT + 28}" y="{ly - 3}">{escape(name)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
