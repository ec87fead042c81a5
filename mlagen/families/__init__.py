"""Kernel families: one package per family under ``mlagen/families/<name>/``.

The protocol and the registry are in :mod:`mlagen.families.base`; this package imports no family,
so the layers below (spec, resources, render) can look families up without importing them.
"""

from __future__ import annotations

from .base import Family, get, names, register

__all__ = ["Family", "get", "names", "register"]
