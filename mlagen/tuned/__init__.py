"""Tuning records shipped with mlagen (``*.json``, the ``mlagen db export --best-only`` format).

Dispatch reads them after the user's own tuning database, so a fresh install on a tuned device
runs the tuned kernels without tuning. ``MLAGEN_NO_SHIPPED=1`` ignores them.
"""
