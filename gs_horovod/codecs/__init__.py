"""The wire formats for (index, value) pairs, by the name the ``wire=`` option takes: each one
module holding one :class:`~.base.PairCodec` (its sizes, its rounding, its kernels on every
backend it has) and one entry below. A new format is one new module and one entry below.

- :mod:`.base`: :class:`~.base.PairCodec`, what the exchanges call, and
  :class:`~.base.MessageCodec`, self-delimiting byte messages with a NumPy reference (the spec)
  and Numba and torch kernels that write its bytes;
- :mod:`.fp32`: int32 index, float32 value, through the framework's own ops;
- :mod:`.elias_fano`: the compact formats' index sections;
- :mod:`.compact`: those and bfloat16 values; :mod:`.compact8`: those and scaled E4M3 values.
"""

from __future__ import annotations

from .base import MessageCodec, PairCodec
from .compact import Compact
from .compact8 import Compact8
from .fp32 import Fp32

CODECS: dict[str, PairCodec] = {c.name: c for c in (Fp32(), Compact(), Compact8())}
"""Every wire format by name, in the order the options list them."""

__all__ = ["CODECS", "MessageCodec", "PairCodec"]
