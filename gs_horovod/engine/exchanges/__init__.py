"""The exchanges, by the name the ``exchange=`` option takes: each one module that declares its
collectives and byte kinds, whether it sends pairs, its defaults for ``exact`` and ``apply`` and
its worth under ``"auto"``, and owns its payload and how it nominates candidates from the
pre-filtered sets (:class:`~.base.Exchange`). The options, the plan (``"auto"`` included), the
payload and :class:`~gs_horovod.engine.state.CommStats` read this registry; a new exchange is
one new module and one entry below."""

from __future__ import annotations

from .allgather import Allgather
from .base import Exchange
from .sketch import Sketch
from .sparse import Sparse

EXCHANGES: dict[str, Exchange] = {x.name: x for x in (Sketch(), Allgather(), Sparse())}
"""Every exchange by name, in the order the options list them."""
