"""Kernel families: the operation a spec implements, and the code that drives its kernels.

A family validates the parts of a spec only it understands, adds its checks to the resource
model, supplies the render context (the parameter struct, the schedule), and launches compiled
variants. Specs name their family; this module maps names to implementations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..errors import SpecError


class Family(ABC):
    name: str

    @abstractmethod
    def validate_spec(self, spec) -> None:
        """Raise SpecError if the spec is not one this family can drive."""

    def check_variant(self, variant, target, resources) -> list[str]:
        """Family-specific reasons to prune ``variant`` on ``target`` (empty: it may compile)."""
        return []

    @abstractmethod
    def render_context(self, variant) -> dict:
        """Extra names for the template (beyond spec, symbol and v)."""


_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    _REGISTRY[family.name] = family
    return family


def get(name: str, path=None) -> Family:
    if name not in _REGISTRY:
        from . import mla_prefill, mla_sparse_prefill  # noqa: F401  (they register themselves)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(path or "<spec>", "family", f"{name!r} is not one of {sorted(_REGISTRY)}") from None
