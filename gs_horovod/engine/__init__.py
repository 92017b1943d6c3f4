"""The gs-SGD engine, framework- and transport-agnostic: the options (:mod:`.config`), the
step's plan (:mod:`.plan`), the step itself (:mod:`.step`), one module per exchange
(:mod:`.exchanges`), and the per-rank state every torch adapter keeps (:mod:`.state`)."""

from .config import SCOPES, GsConfig, count_for
from .payload import Payload, collectives_of
from .plan import Plan
from .state import CommStats, EngineState
from .step import GsSgd, StepResult

__all__ = ["SCOPES", "CommStats", "EngineState", "GsConfig", "GsSgd", "Payload", "Plan", "StepResult",
           "collectives_of", "count_for"]
