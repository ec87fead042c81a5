"""What every ``mlagen`` command shares: one-line errors for user mistakes, and text tables."""

from __future__ import annotations

import functools
import sys

import click

from .errors import MlagenError

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _friendly(fn):
    """Turn library errors into one-line click errors."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlagenError as exc:
            raise click.ClickException(str(exc).splitlines()[0] if _one_line(exc) else str(exc)) from None
        except ValueError as exc:  # malformed knob values
            raise click.ClickException(str(exc)) from None
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            command = click.get_current_context().info_name
            raise click.ClickException(
                f"mlagen {command} needs PyTorch, which is not installed: python3 -m pip install torch "
                f"(CPU-only: add --index-url {TORCH_CPU_INDEX})") from None
        except OSError as exc:  # an output directory that cannot be written, a file that cannot be read
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from None
        except KeyboardInterrupt:
            # The library has stopped its worker processes by now; 130 is the shell's Ctrl-C status.
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def _one_line(exc: Exception) -> bool:
    from .errors import CompileError

    return not isinstance(exc, CompileError)


def _shown(text: str) -> str:
    """``text`` with control and format characters (NUL, escape sequences, RTL overrides) written
    as escapes, so a hand-edited record cannot garble or disguise a table."""
    import unicodedata

    if all(unicodedata.category(ch)[0] != "C" for ch in text):
        return text
    return "".join(ch if unicodedata.category(ch)[0] != "C" else ascii(ch)[1:-1] for ch in text)


def table(headers: list[str], rows: list[list]) -> str:
    """Fixed-width text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else _shown(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
