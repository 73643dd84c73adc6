"""Which Composer algorithms help on *your* task: a measured recipe search.

``search_recipe(make_module, make_data, monitor=..., ...)`` trains your module (real Lightning fits,
your Trainer settings) with and without candidate algorithms at several run lengths, each run validated
as it trains and stopped once it cannot win, and hands back a run to start: ``result.prescription``,
the algorithms and the run length, with the time to the target it measured in exactly that run and an
interval from a seed no decision used (``method="greedy"``: the earlier greedy search over curves). The command
``python -m composer_bridge.search --config search.yaml`` does the same from a LightningCLI-style
config. See docs/search.md.

Examples:
    >>> from composer_bridge.search import Candidate, search_recipe
    >>> Candidate("MixUp", {"alpha": 0.2}).label
    'MixUp'
"""

from composer_bridge.search.candidates import DEFAULT_CANDIDATES, Candidate, from_recipe, with_ladders
from composer_bridge.search.errors import BudgetWarning, CandidateWarning, SearchInputError
from composer_bridge.search.estimate import Estimate
from composer_bridge.search.executor import Executor, InProcessExecutor
from composer_bridge.search.prescription import Prescription
from composer_bridge.search.proxy import Proxy
from composer_bridge.search.ray_executor import RayExecutor
from composer_bridge.search.results import CurveResult, SearchResult
from composer_bridge.search.scoring import SpeedUp, strict_speedup, time_to_reach
from composer_bridge.search.search import search_recipe
from composer_bridge.search.state import StaleStateError
from composer_bridge.search.trial import FitRecord

__all__ = ["DEFAULT_CANDIDATES", "BudgetWarning", "Candidate", "CandidateWarning", "CurveResult", "Estimate", "Executor", "FitRecord", "InProcessExecutor", "Prescription", "Proxy", "SearchInputError",
           "SearchResult", "SpeedUp", "StaleStateError", "RayExecutor", "from_recipe", "search_recipe", "strict_speedup", "time_to_reach",
           "with_ladders"]
