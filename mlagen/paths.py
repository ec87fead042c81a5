"""Where the packaged templates, specs and shipped tuning records live.

In a source checkout they are the top-level ``templates/`` and ``specs/``; in an installed wheel
they are ``mlagen/templates`` and ``mlagen/specs`` (pyproject maps one onto the other).
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = _PKG / name
    if installed.is_dir():
        return installed
    return _PKG.parent / name


def templates_dir() -> Path:
    return _data_dir("templates")


def include_dir() -> Path:
    """Device headers, included by the rendered sources (``#include "mlagen/sm80/..."``)."""
    return templates_dir() / "include"


def specs_dir() -> Path:
    return _data_dir("specs")


def tuned_dir() -> Path:
    """Tuning records shipped with the package (read-only defaults)."""
    return _PKG / "tuned"
