"""mlagen under other libraries' attention interfaces.

* :mod:`mlagen.integrations.flash_attn`: FlashAttention's dense calls (``flash_attn_varlen_func``,
  ``flash_attn_func``) on mlagen's kernels, also exported as ``mlagen.flash_attn_varlen_func`` /
  ``mlagen.flash_attn_func``, so a serving stack (vLLM, SGLang) swaps the import.
* :mod:`mlagen.integrations.transformers`: ``attn_implementation="mlagen"`` for transformers'
  MLA models (DeepSeek-V3, Kimi-K2) and DeepSeek-V4, registered by importing the module.
* :mod:`mlagen.integrations.deepseek_v4`: DeepSeek-V4's index lists (from a mask or from
  positions) and its call on the sparse prefill; imports torch, not transformers.

Importing this package imports nothing; each module imports torch (and transformers) itself.
"""
