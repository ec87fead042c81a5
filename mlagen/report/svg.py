"""Plots as inline SVG text: scatter, step lines and bars, drawn with light markup.

Every string that reaches the page goes through :func:`esc` (database text can hold anything:
NUL, bidi overrides, ``<script>``). Points are segments of one ``<path>`` per colour and column
(``M x y h0`` with round caps draws a dot), so a plot of 10,000 trials stays a few hundred KB of text.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

# Control characters and the bidi controls that reorder text on screen (a symbol that reads one way
# and is another): shown as \uXXXX, never passed through.
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")

FONT = 11  # px, axis labels
PALETTE = ("#1c7ed6", "#e8590c", "#2f9e44", "#ae3ec9", "#f59f00", "#0c8599", "#e03131", "#5c940d",
           "#6741d9", "#868e96")


def esc(value) -> str:
    """``value`` as text safe inside HTML or SVG, attributes included."""
    text = _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", str(value))
    return html.escape(text, quote=True)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


@dataclass
class Frame:
    """A plot's pixel box and the data ranges mapped onto it."""

    width: int
    height: int
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    left: int = 56
    right: int = 12
    top: int = 22
    bottom: int = 40

    def x(self, v: float) -> float:
        span = self.x_hi - self.x_lo or 1.0
        return self.left + (v - self.x_lo) / span * (self.width - self.left - self.right)

    def y(self, v: float) -> float:
        span = self.y_hi - self.y_lo or 1.0
        return self.height - self.bottom - (v - self.y_lo) / span * (self.height - self.top - self.bottom)

    @property
    def plot_bottom(self) -> float:
        return self.height - self.bottom


@dataclass
class Svg:
    """One plot being drawn: append elements, then :meth:`text`."""

    frame: Frame
    title: str
    parts: list[str] = field(default_factory=list)
    marks: int = 0

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def label(self, x: float, y: float, text: str, anchor: str = "middle", size: int = FONT,
              colour: str = "#333", rotate: bool = False, bold: bool = False) -> None:
        transform = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
        weight = ' font-weight="bold"' if bold else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{colour}"'
                 f'{weight}{transform}>{esc(text)}</text>')

    def dots(self, points: list[tuple[float, float]], colour: str, size: float = 5.0, opacity: float = 0.75) -> None:
        """Data points (pixel coordinates) as one path of zero-length round-capped segments."""
        if not points:
            return
        self.path([f"M{x:.1f} {y:.1f}h0" for x, y in points], colour, size, opacity)

    def path(self, segments: list[str], colour: str, size: float = 5.0, opacity: float = 0.75) -> None:
        """Data points given as ready ``M x y h0`` segments (the fast form of :meth:`dots`)."""
        if not segments:
            return
        self.add(f'<path class="mark" d="{"".join(segments)}" stroke="{colour}" stroke-width="{size}"'
                 f' stroke-linecap="round" stroke-opacity="{opacity}" fill="none"/>')
        self.marks += len(segments)

    def polyline(self, points: list[tuple[float, float]], colour: str, width: float = 1.5, dash: str = "") -> None:
        if not points:
            return
        d = "M" + "L".join(f"{x:.1f} {y:.1f}" for x, y in points)
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<path class="mark" d="{d}" stroke="{colour}" stroke-width="{width}" fill="none"{extra}/>')
        self.marks += 1

    def rect(self, x: float, y: float, w: float, h: float, colour: str, tip: str = "") -> None:
        title = f"<title>{esc(tip)}</title>" if tip else ""
        self.add(f'<rect class="mark" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{max(h, 0.5):.1f}"'
                 f' fill="{colour}">{title}</rect>')
        self.marks += 1

    def line(self, x1: float, y1: float, x2: float, y2: float, colour: str = "#ccc", width: float = 1,
             dash: str = "") -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}"'
                 f' stroke-width="{width}"{extra}/>')

    def y_axis(self, label: str, ticks: list[float] | None = None, digits: int | None = None) -> None:
        f = self.frame
        ticks = nice_ticks(f.y_lo, f.y_hi) if ticks is None else ticks
        digits = _digits(ticks) if digits is None else digits
        for t in ticks:
            y = f.y(t)
            self.line(f.left, y, f.width - f.right, y, "#eee")
            self.label(f.left - 4, y + 3.5, f"{t:.{digits}f}", anchor="end")
        self.line(f.left, f.top, f.left, f.plot_bottom, "#999")
        self.label(12, (f.top + f.plot_bottom) / 2, label, rotate=True)

    def x_axis(self, label: str, ticks: list[tuple[float, str]] | None = None) -> None:
        f = self.frame
        if ticks is None:
            values = nice_ticks(f.x_lo, f.x_hi, 8)
            digits = _digits(values)
            ticks = [(t, f"{t:.{digits}f}") for t in values]
        for value, text in ticks:
            x = f.x(value)
            self.line(x, f.plot_bottom, x, f.plot_bottom + 4, "#999")
            self.label(x, f.plot_bottom + 15, text)
        self.line(f.left, f.plot_bottom, f.width - f.right, f.plot_bottom, "#999")
        self.label((f.left + f.width - f.right) / 2, f.height - 6, label)

    def legend(self, items: list[tuple[str, str]], x: float | None = None, y: float = 12) -> None:
        """Coloured keys in a row along the top."""
        x = self.frame.left if x is None else x
        for colour, text in items:
            self.add(f'<rect x="{x:.1f}" y="{y - 8:.1f}" width="9" height="9" fill="{colour}"/>')
            self.label(x + 12, y, text, anchor="start")
            x += 24 + 6.2 * len(text)

    def text(self) -> str:
        f = self.frame
        return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{f.width}" height="{f.height}"'
                f' viewBox="0 0 {f.width} {f.height}" data-marks="{self.marks}" role="img">'
                f'<title>{esc(self.title)}</title>' + "".join(self.parts) + "</svg>")


def _digits(ticks: list[float]) -> int:
    """Fewest decimals that write every tick exactly."""
    for d in range(5):
        if all(abs(round(t, d) - t) <= 1e-9 * max(1.0, abs(t)) for t in ticks):
            return d
    return 4


GOLDEN, PLASTIC = 0.6180339887, 0.7548776662  # two unrelated steps: sideways and up-down spreads do not line up


def jitter(i: int, width: float, step: float = GOLDEN) -> float:
    """A deterministic spread in [-width/2, width/2] for the i-th point of a category."""
    return ((i * step) % 1.0 - 0.5) * width


def padded(lo: float, hi: float, share: float = 0.05) -> tuple[float, float]:
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * share
    return lo - pad, hi + pad


def hbars(title: str, rows: list[tuple[str, float, str, str]], unit: str, width: int = 1000,
          label_width: int = 300, note_width: int = 300) -> str:
    """Horizontal bars: (label, value, colour, note at the bar's end) per row, from zero."""
    height = 34 + 24 * len(rows) + 30
    hi = max((v for _, v, _, _ in rows), default=1.0) * 1.05 or 1.0
    frame = Frame(width, height, 0.0, hi, 0.0, 1.0, left=label_width, right=note_width, top=20, bottom=30)
    s = Svg(frame, title)
    for t in nice_ticks(0.0, hi, 5):
        x = frame.x(t)
        s.line(x, frame.top, x, frame.plot_bottom, "#eee")
        s.label(x, frame.plot_bottom + 14, f"{t:.{_digits(nice_ticks(0.0, hi, 5))}f}")
    s.label((frame.left + width - note_width) / 2, height - 4, unit)
    for i, (label, value, colour, note) in enumerate(rows):
        y = frame.top + 4 + 24 * i
        s.label(frame.left - 6, y + 13, _clip(label, label_width // 6), anchor="end")
        s.rect(frame.left, y, frame.x(value) - frame.left, 18, colour, f"{label}: {value:g} {unit} {note}")
        if note:
            s.label(frame.x(value) + 4, y + 13, _clip(note, note_width // 6), anchor="start", colour="#555")
    return s.text()


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
