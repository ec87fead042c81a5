"""Progress of long work (tuning, building many variants) on stderr.

On a terminal (or when asked) a bar redrawn in place: done / total, elapsed, an ETA from the
rate so far (or the time budget, if sooner), and the last item. Elsewhere (a log file, CI) the
bar is off and the caller's plain lines are the record.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

WIDTH = 28


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """A progress bar; ``enabled`` None means: only if ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else enabled
        self.clock = clock
        self.total, self.done, self.label, self.budget_s, self.t0, self.note = 0, 0, "", None, 0.0, ""
        self._drawn = False

    def start(self, total: int, label: str = "", budget_s: float | None = None) -> None:
        self.total, self.done, self.label, self.budget_s = max(0, total), 0, label, budget_s
        self.t0, self.note = self.clock(), ""
        self._draw()

    def eta(self) -> float | None:
        """Seconds left: the rate so far times the items left, or the budget left if sooner."""
        elapsed = self.clock() - self.t0
        guesses = []
        if self.done and self.total > self.done:
            guesses.append(elapsed / self.done * (self.total - self.done))
        if self.budget_s is not None:
            guesses.append(max(0.0, self.budget_s - elapsed))
        return min(guesses) if guesses else None

    def line(self) -> str:
        frac = min(1.0, self.done / self.total) if self.total else 0.0
        filled = int(frac * WIDTH)
        eta = self.eta()
        text = (f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} "
                f"{_clock_text(self.clock() - self.t0)} elapsed"
                + (f", ETA {_clock_text(eta)}" if eta is not None else ""))
        return f"{text}  {self.note}" if self.note else text

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self.note = note[:60]
        self._draw()

    def message(self, text: str) -> None:
        """A plain line above the bar (the bar is redrawn under it)."""
        if self.enabled and self._drawn:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._draw()

    def finish(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self._drawn = False

    def _draw(self) -> None:
        if not self.enabled or not self.total:
            return
        self.stream.write("\r\033[K" + self.line())
        self.stream.flush()
        self._drawn = True
