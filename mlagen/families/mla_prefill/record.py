"""What dense MLA prefill tells ``MLAGEN_RECORD_SHAPES`` about a call (see :mod:`mlagen.shapelog`)."""

from __future__ import annotations

from ... import shapelog
from .call import Call
from .problem import DEFAULT_GEOMETRY


def describe_call(call: Call) -> str:
    """The shape description of a call: its batch, mean query and key length per sequence, heads, mask."""
    b = max(call.batch, 1)
    parts = [f"b={call.batch}", f"q={round(call.total_q / b)}"]
    if call.total_k != call.total_q:
        parts.append(f"k={round(call.total_k / b)}")
    parts.append(f"h={call.heads}")
    t = call.traits
    if t.geometry != DEFAULT_GEOMETRY:
        parts.append("d=" + "/".join(map(str, t.dims)))
    parts.append({"window": f"window={t.window[0]}/{t.window[1]}", "chunked": f"chunk={t.chunk}"}.get(t.mask, t.mask))
    if t.softcap:
        parts.append(f"softcap={t.softcap:g}")
    if t.attn_sink is not None:
        parts.append("sink")
    return ",".join(parts)


def note(call: Call) -> None:
    if shapelog.enabled():
        shapelog.note("mla_prefill", str(call.key), lambda: describe_call(call))
