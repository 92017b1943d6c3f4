"""The exchanges, by the name the ``exchange=`` option takes: each one module that owns its
payload, how it nominates candidates from the pre-filtered sets, and its defaults for
``exact`` and ``apply`` (:class:`~.base.Exchange`). A new exchange is one new module and one
entry below."""

from __future__ import annotations

from .allgather import Allgather
from .base import Exchange
from .sketch import Sketch
from .sparse import Sparse

EXCHANGES: dict[str, Exchange] = {x.name: x for x in (Sketch(), Allgather(), Sparse())}
"""Every exchange by name, in the order the options list them."""
