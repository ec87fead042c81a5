"""Rendered device source: what the renderer produces and a compiler consumes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .cache import atomic_write


@dataclass(frozen=True)
class Source:
    """Rendered device source, ready for a compiler."""

    name: str                      # file name, e.g. "<symbol>.cu"
    text: str
    symbol: str                    # the extern "C" entry point
    include_dirs: tuple[str, ...]
    spec_name: str
    variant: str                   # variant.describe()

    def write(self, directory: Path) -> Path:
        """Write the source under ``directory`` (atomically) and return its path."""
        path = Path(directory) / self.name
        atomic_write(path, self.text.encode())
        return path
