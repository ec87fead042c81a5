"""mlagen.progress: the bar on a terminal (or when asked), nothing elsewhere."""

from __future__ import annotations

import io

from mlagen.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_off_when_not_a_terminal():
    out = io.StringIO()
    bar = Progress(out)
    bar.start(10, "D1")
    bar.update(note="ok")
    bar.finish()
    assert not bar.enabled and out.getvalue() == ""
    bar.message("a line")
    assert out.getvalue() == "a line\n"


def test_bar_with_eta_on_a_terminal():
    out, clock = Tty(), Clock()
    bar = Progress(out, clock=clock)
    assert bar.enabled
    bar.start(10, "D1")
    clock.now += 30
    bar.update(3, note="ok mla_prefill_sm90_x")
    line = bar.line()
    assert "D1 [########" in line and "3/10" in line and "0:30 elapsed" in line and "ETA 1:10" in line
    assert "ok mla_prefill_sm90_x" in line
    assert out.getvalue().endswith(line) and "\r" in out.getvalue()
    bar.message("stage line")
    assert "stage line\n" in out.getvalue() and out.getvalue().endswith(bar.line())
    bar.finish()
    assert out.getvalue().endswith("\r\033[K")


def test_budget_bounds_the_eta():
    clock = Clock()
    bar = Progress(io.StringIO(), enabled=True, clock=clock)
    bar.start(200, "D2", budget_s=60)
    clock.now += 10
    bar.update()
    assert bar.eta() == 50  # the rate alone says 1990 s
    assert "ETA 0:50" in bar.line()


def test_forced_on_without_a_terminal():
    out = io.StringIO()
    bar = Progress(out, enabled=True)
    bar.start(2, "build")
    bar.update()
    assert "1/2" in out.getvalue()
