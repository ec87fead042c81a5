"""The errors mlagen raises.

Every error is picklable (tuning runs trials in worker processes and sends failures back) and
its message says what to change.
"""

from __future__ import annotations


class MlagenError(Exception):
    """Base class of every error mlagen raises on purpose."""

    def __reduce__(self):
        return (self.__class__, self.args)


class SpecError(MlagenError):
    """A kernel spec (YAML) is malformed or names something impossible.

    The message starts with ``<file>: <key path>: `` so the user can find the line.
    """

    def __init__(self, path, key: str, message: str):
        self.path = str(path)
        self.key = key
        self.message = message
        where = f"{self.path}: {key}: " if key else f"{self.path}: "
        super().__init__(where + message)

    def __reduce__(self):
        return (self.__class__, (self.path, self.key, self.message))


class VariantError(MlagenError):
    """A variant breaks a constraint or a resource budget; it is pruned before compiling."""


class RenderError(MlagenError):
    """A template failed to render (a typo in the template is an error, not an empty string)."""


class CompileError(MlagenError):
    """The device compiler rejected a rendered source.

    Carries the full compiler log and the path of the rendered source that failed.
    """

    def __init__(self, message: str, log: str = "", source_path: str | None = None):
        self.log = log
        self.source_path = source_path
        text = message
        if source_path:
            text += f"\n  rendered source: {source_path}"
        if log:
            text += "\n" + log.rstrip()
        super().__init__(text)
        self.message = message

    def __reduce__(self):
        return (self.__class__, (self.message, self.log, self.source_path))


class DriverError(MlagenError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


class NoDeviceError(MlagenError):
    """No usable GPU (no driver, no device, or an architecture no kernel family targets)."""


class LaunchError(MlagenError):
    """Arguments to a kernel entry point are invalid; the message names the argument.

    Raised as :class:`ArgumentError` (also a ValueError) or :class:`ArgumentTypeError` (also a
    TypeError), so callers may catch the builtin type or this one.
    """


class ArgumentError(LaunchError, ValueError):
    """An argument has a wrong value (shape, stride, range); the message names it."""


class ArgumentTypeError(LaunchError, TypeError):
    """An argument has a wrong type or dtype; the message names it."""


class CacheError(MlagenError):
    """The compile cache or the output directory cannot be used (not a directory, read-only,
    full); the message names the path and the variable that sets it."""


class OutputError(MlagenError):
    """An output path cannot be written as asked (a device node, a directory); the message names it."""


class TuningError(MlagenError):
    """The tuner could not run (no variant survived pruning, no GPU, bad shape name)."""


class DatabaseError(MlagenError):
    """The tuning database is unreadable, or an import file does not match its format."""


class BenchError(MlagenError):
    """A benchmark cannot run as asked: an unknown shape or peer id, no GPU, or a peer that cannot
    run a shape the way BENCHMARKS.md requires (the message says which and why)."""


class PeerUnsupported(BenchError):
    """A bench peer has no way to run a shape at all (no kernel for its head geometry or mask):
    reported as "not supported (why)", the other peers still timed."""


class ShapeError(BenchError, ValueError):
    """A shape description, shape id or workload file is malformed; the message names the bad
    item and what is allowed. A ValueError too: it is an argument error."""
