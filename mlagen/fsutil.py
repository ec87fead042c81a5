"""The one way mlagen writes a file: atomically, durably, and only over a regular file.

Every file mlagen writes (exports, expectations, JUnit reports, benchmark reports, rendered
sources, binaries) goes through :func:`atomic_write`: the data goes to a temporary file in the
destination's directory, is flushed and fsync'ed, and replaces the destination with one
``os.replace``, so a reader (or a crash) sees the old file or the whole new one.

What it replaces, decided the way git's lockfiles do it:

- A symbolic link is followed: its final target is written and the link is kept (git resolves
  the link and commits the lock beside the target; ``os.replace`` on the link itself would put a
  plain file where the user's link was).
- Something that is not a regular file (a device node such as ``/dev/full`` or ``/dev/null``, a
  FIFO, a socket, a directory) is refused with :class:`~mlagen.errors.OutputError`: replacing
  ``/dev/full`` with an XML file (as root) breaks the system, and writing into a FIFO is not
  atomic. Write to a real path instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from .errors import MlagenError, OutputError

MAX_YAML_BYTES = 1 << 20  # a workload or spec file is a few KB


class InputError(MlagenError, ValueError):
    """A file mlagen reads is missing, not a regular file, too large, not UTF-8 or not plain YAML;
    the message names the file."""


def umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask sets it, briefly,
    for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def destination(path: Path | str) -> Path:
    """The file a write to ``path`` replaces: ``path`` with symbolic links followed; OutputError
    if that exists and is not a regular file."""
    path = Path(path).expanduser()
    real = Path(os.path.realpath(path))
    try:
        st = real.stat()
    except FileNotFoundError:
        return real
    except OSError as exc:
        raise OutputError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise OutputError(f"{path}: is {kind}; mlagen writes only regular files, give a file path")
    return real


def atomic_write(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` (see the module doc): readers see the old file or the whole new
    one. The file gets the permissions ``open`` would give it (0666 less the umask), not the
    temporary file's 0600."""
    target = destination(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask())
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_text(path: Path | str, what: str, limit: int = MAX_YAML_BYTES) -> str:
    """A small UTF-8 text file's contents; InputError naming the file (and ``what`` it should be)
    when it is missing, not a regular file (/dev/zero would never end), larger than ``limit``, or
    not UTF-8."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file; expected a {what}")
        if st.st_size > limit:
            raise InputError(f"{path}: {st.st_size} bytes; a {what} may have at most {limit}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None


def plain_yaml_loader(base=None):
    """A safe YAML loader that refuses anchors and aliases: a few lines of ``&a [*b, *b, ...]``
    expand to gigabytes (a "billion laughs" bomb), and mlagen's files never need them."""
    import yaml

    base = base or yaml.SafeLoader

    class Loader(base):
        def compose_node(self, parent, index):
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", event.start_mark)
            event = self.peek_event()
            if getattr(event, "anchor", None) is not None:
                raise yaml.composer.ComposerError(None, None, "anchors (&name) are not allowed", event.start_mark)
            return super().compose_node(parent, index)

    return Loader


def read_yaml(path: Path | str, what: str):
    """A small plain YAML file (no anchors or aliases), parsed; InputError naming the file."""
    import yaml

    text = read_text(path, what)
    try:
        return yaml.load(text, Loader=_PLAIN)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}:{where} not YAML ({problem})") from None
    except RecursionError:
        raise InputError(f"{path}: not YAML (nested too deeply)") from None


_PLAIN = plain_yaml_loader()
