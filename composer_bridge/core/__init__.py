"""The framework-agnostic engine core: events, time, state, algorithms, the engine and its passes.

Nothing here imports Lightning; the core runs in any training loop, or in none.
"""

from composer_bridge.core.algorithm import Algorithm, AlgorithmError
from composer_bridge.core.callback import Callback
from composer_bridge.core.engine import Engine, RemovableEventHandle
from composer_bridge.core.event import Event, EventFilter, EventList
from composer_bridge.core.logger import Logger, LoggerDestination
from composer_bridge.core.profiler import Marker, Profiler
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, Timestamp, TimeUnit
from composer_bridge.core.trace import Trace, Traces

__all__ = [
    "Algorithm",
    "AlgorithmError",
    "Callback",
    "Engine",
    "Event",
    "EventFilter",
    "EventList",
    "Logger",
    "LoggerDestination",
    "Marker",
    "Profiler",
    "RemovableEventHandle",
    "State",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trace",
    "Traces",
]
