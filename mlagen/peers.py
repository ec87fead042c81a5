"""Benchmark peers built outside mlagen (FlashAttention-3, FlashMLA): where their builds are, and
loading them.

A peer build is a folder under the peers directory (``MLAGEN_PEERS_DIR``, else
``<repo>/../shared/peers``, else ``<repo>/shared/peers``; :func:`mlagen.knobs.peers_dir`) that
holds a Python wrapper (``fa3/fa3_peer.py``) and, once built on the GPU machine, the compiled
library it loads. The library's path follows the wrapper's own rule: an environment variable
naming the file, else one naming its build folder, else ``<folder>/build/<library>``. The family
packages declare their external peers as :class:`ExternalBuild` values; ``mlagen bench`` asks
them whether they are there (:meth:`ExternalBuild.status`) before it asks for a peer. A peer that
one of this repository's tools builds (``tools/fa3_extra``) is a :class:`ProjectBuild`: a torch op
library in ``<repo>/out/<tool>``.

Importing this module imports neither torch nor the wrappers.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from . import knobs
from .errors import BenchError


@dataclass(frozen=True)
class ExternalBuild:
    """Where one external peer lives and how it says it is built.

    ``folder``: its folder in the peers directory; ``wrapper``: the wrapper module's name (file
    ``<wrapper>.py`` in the folder, with a ``load()`` that loads the library); ``library``: the
    compiled file's name; ``so_env`` / ``build_env``: the wrapper's variables for the file and for
    its build folder; ``what``: the library's name in messages; ``hint``: how to build it."""

    folder: str
    wrapper: str
    library: str
    so_env: str
    build_env: str
    what: str
    hint: str

    def wrapper_path(self) -> Path | None:
        root = knobs.peers_dir()
        return None if root is None else root / self.folder / f"{self.wrapper}.py"

    def library_path(self, wrapper: Path) -> Path:
        """The compiled library the wrapper at ``wrapper`` would load (by the wrapper's rule)."""
        if os.environ.get(self.so_env):
            return Path(os.environ[self.so_env])
        return Path(os.environ.get(self.build_env) or wrapper.parent / "build") / self.library

    def status(self) -> tuple[str | None, str]:
        """(path of the wrapper, "") if the build is present, else (None, why not, and how to build it)."""
        wrapper = self.wrapper_path()
        if wrapper is None:
            return None, (f"no peers directory (set {knobs.PEERS_DIR.name}, or put it at <repo>/../shared/peers)")
        if not wrapper.is_file():
            return None, f"{wrapper} not found"
        so = self.library_path(wrapper)
        if not so.exists():
            return None, f"{self.what} is not built ({so} not found); {self.hint}"
        return str(wrapper), ""

    def why_not(self) -> str | None:
        """None if the build is present, else why not (a :attr:`mlagen.families.base.Peer.status`)."""
        return self.status()[1] or None

    def load(self):
        """The wrapper module, imported once per process, its library loaded.

        Raises:
            BenchError: saying why the build is missing.
        """
        path, why = self.status()
        if path is None:
            raise BenchError(why)
        module = sys.modules.get(self.wrapper)
        if module is None:
            spec = importlib.util.spec_from_file_location(self.wrapper, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[self.wrapper] = module
        module.load()
        return module


@dataclass(frozen=True)
class ProjectBuild:
    """A peer library built by one of this repository's tools (``tools/<tool>/build.py``) into
    ``<repo>/out/<tool>``: a torch op library, loaded with ``torch.ops.load_library``.

    The file is ``$<so_env>``, else ``$<build_env>/<library>``, else ``<repo>/out/<tool>/<library>``;
    ``namespace`` is its ``torch.ops`` namespace; ``what`` its name in messages."""

    tool: str
    library: str
    namespace: str
    so_env: str
    build_env: str
    what: str

    def library_path(self) -> Path:
        if os.environ.get(self.so_env):
            return Path(os.environ[self.so_env])
        repo = Path(__file__).resolve().parent.parent
        return Path(os.environ.get(self.build_env) or repo / "out" / self.tool) / self.library

    def why_not(self) -> str | None:
        """None if the library is there, else why not and how to build it."""
        so = self.library_path()
        if so.exists():
            return None
        return (f"{self.what} is not built ({so} not found); build it on the GPU machine with: "
                f"python tools/{self.tool}/build.py")

    def load(self):
        """The op namespace (``torch.ops.<namespace>``), the library loaded once per process.

        Raises:
            BenchError: saying why the library is missing."""
        import torch

        why = self.why_not()
        if why is not None:
            raise BenchError(why)
        path = str(self.library_path())
        if path not in getattr(torch.ops, "loaded_libraries", ()):
            torch.ops.load_library(path)
        return getattr(torch.ops, self.namespace)
