"""Functional forms of the algorithms: plain tensor/module functions, usable in any training loop.

Composer's names and argument order (``smooth_labels``, ``mixup_batch``, ``apply_blurpool``, ...).
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).

__all__: list[str] = []
