"""mlagen: generate, tune and ship multi-head latent attention (MLA) prefill kernels.

The tensor API is :func:`mla_prefill` (dense) and :func:`mla_sparse_prefill` /
:func:`flash_mla_sparse_fwd` (sparse, DeepSeek-V3.2 DSA; DeepSeek-V4's two pools in one softmax,
with :func:`window_indices` building the sliding window's index lists on the device), with FlashAttention's dense calls
:func:`flash_attn_varlen_func` / :func:`flash_attn_func` (``mlagen.integrations.flash_attn``);
the command line is ``mlagen`` (see ``mlagen --help``).

Importing mlagen (or any of its modules below the tensor API) needs neither torch nor a GPU, and
does not import torch. The torch operators (``torch.ops.mlagen.mla_prefill`` and the others) are
registered as soon as both mlagen and torch are imported, in either order: at ``import mlagen``
when torch is already loaded, else right after ``import torch`` finishes (a one-shot import hook).
"""

from __future__ import annotations

import sys

__version__ = "0.1.0"

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_mla_sparse_fwd", "mla_prefill",
           "mla_sparse_prefill", "window_indices", "__version__"]

_API = ("mla_prefill", "mla_sparse_prefill", "flash_mla_sparse_fwd", "window_indices")
_FLASH_ATTN = ("flash_attn_func", "flash_attn_varlen_func")


def __getattr__(name: str):
    # Loaded on first use, so that importing a leaf module (mlagen.expr) loads neither the
    # dispatcher nor torch.
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in _FLASH_ATTN:
        from .integrations import flash_attn

        return getattr(flash_attn, name)
    raise AttributeError(f"module 'mlagen' has no attribute {name!r}")


def _register_ops() -> None:
    """Import the tensor API, whose modules register the ``torch.ops.mlagen`` operators. A failure
    must not break ``import torch`` or ``import mlagen``: it is a warning, and the first call of
    the tensor API raises it again."""
    try:
        from . import api  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failure: the import it rides on must go on)
        import warnings

        warnings.warn(f"mlagen: torch.ops.mlagen.* are not registered: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=2)


class _LoaderThenRegister:
    """torch's own loader, followed by :func:`_register_ops` once torch's module has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # torch's module names its own loader, as if no hook had been there.
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _register_ops()

    def __getattr__(self, name):  # resources, get_code, is_package...: torch's loader answers
        return getattr(self._loader, name)


class _TorchImportHook:
    """(A meta path finder, duck-typed: importlib.abc costs 15 ms to import.) Finds nothing itself: on the first ``import torch`` it takes itself off sys.meta_path, lets
    the other finders find torch, and wraps the loader so that mlagen's ops follow torch's import."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        _remove_hook()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _LoaderThenRegister(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchImportHook)]


if "torch" in sys.modules:
    _register_ops()
elif not any(isinstance(f, _TorchImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchImportHook())
