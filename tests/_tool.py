"""The project's scripts under tools/ as modules for the tests (tools/ is no package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool(path: str):
    """``tools/<path>`` imported afresh (a test's changes to it stay with its copy), registered in
    ``sys.modules`` as dataclasses and pickling need."""
    name = "mlagen_tool_" + path.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, TOOLS / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
