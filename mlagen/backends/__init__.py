"""Vendor backends beside the CUDA path in ``compiler.py`` / ``runtime.py``.

``hip``: AMD Instinct (gfx942, gfx950): hipRTC and offline clang compilers, the AMDGPU code
object reader (resources, disassembly) and the hip-python module loader and launcher.
"""
