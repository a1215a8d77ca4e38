"""Selection in the SVT model (paper §6): Algorithms 6, 7, 8, 9 and Corollary 6.8,
and two variants built from them (the practical and the scan selection).

Every algorithm here touches data only through `Oracle` streams: it learns the
index of the first YES of each chunk, nothing else.  Privacy is therefore basic
composition of the stream budgets it opens, and every accuracy figure α it uses
comes from `oracle.accuracy` for the stream's own noise model.

Candidates are `Query` objects (a coordinate of the aggregate or its complement)
with an optional public *offset* w: the candidate's score is q(S) + w, and
comparing it with a threshold τ is the SVT query (q, τ − w).  Offsets are how
MWEM's shifted scores fold into thresholds (algorithms.md §3).

Modules: `records` (candidates, search spaces, results), `session` (one run's
streams and spend), `search` (Algorithm 8's rounds and descending-scan levels),
`plans` (options and data-independent plans), `paper` (the paper's algorithms),
`practical` and `scan` (the variants), and `noisy_max` (report-noisy-max, the
baseline that is not an SVT selection).  The public names are re-exported here.
"""

from svtagg.analyst.selection.noisy_max import (
    NoisyMaxResult,
    check_candidates,
    noisy_max_selection,
)
from svtagg.analyst.selection.paper import (
    binary_search,
    binary_search_rounds,
    geometric_binary_search,
    linear_scan,
    sampling_and_filtering,
    sum_estimation,
)
from svtagg.analyst.selection.plans import (
    PAPER_CUTOFF,
    PAPER_FINAL_ROUNDS,
    PRACTICAL_COARSE_FRACTION,
    PRACTICAL_KINDS,
    PRACTICAL_STEP_SCALE,
    SCAN_COARSE_FRACTION,
    SCAN_MID_FRACTION,
    SCAN_STEP_SCALE,
    TUNED_CUTOFF,
    AccuracyFn,
    Phase,
    PracticalOptions,
    PracticalPlan,
    SamplingPlan,
    ScanOptions,
    ScanPlan,
    plan_for,
    plan_practical,
    plan_sampling_and_filtering,
    plan_scan,
)
from svtagg.analyst.selection.practical import practical_selection
from svtagg.analyst.selection.records import (
    Candidates,
    Region,
    ScanTopK,
    SearchSpace,
    SelectionResult,
    Spend,
    SumEstimate,
    Variant,
    variant_of,
)
from svtagg.analyst.selection.scan import RankProgress, scan_selection, scan_top_k
from svtagg.analyst.selection.search import (
    GBS_RATIO,
    SCAN_RANK_DENSE,
    SCAN_RANK_RELATIVE,
    GbsSchedule,
    gbs_budgets,
)
from svtagg.analyst.selection.session import ROUNDING_SLACK, default_rounds
from svtagg.dp.queries import Epsilon, Query

__all__ = [
    "GBS_RATIO",
    "PAPER_CUTOFF",
    "PAPER_FINAL_ROUNDS",
    "PRACTICAL_COARSE_FRACTION",
    "PRACTICAL_KINDS",
    "PRACTICAL_STEP_SCALE",
    "ROUNDING_SLACK",
    "SCAN_COARSE_FRACTION",
    "SCAN_MID_FRACTION",
    "SCAN_RANK_DENSE",
    "SCAN_RANK_RELATIVE",
    "SCAN_STEP_SCALE",
    "TUNED_CUTOFF",
    "AccuracyFn",
    "Candidates",
    "Epsilon",
    "GbsSchedule",
    "NoisyMaxResult",
    "Phase",
    "PracticalOptions",
    "PracticalPlan",
    "Query",
    "RankProgress",
    "Region",
    "SamplingPlan",
    "ScanOptions",
    "ScanPlan",
    "ScanTopK",
    "SearchSpace",
    "SelectionResult",
    "Spend",
    "SumEstimate",
    "Variant",
    "binary_search",
    "binary_search_rounds",
    "check_candidates",
    "default_rounds",
    "gbs_budgets",
    "geometric_binary_search",
    "linear_scan",
    "noisy_max_selection",
    "plan_for",
    "plan_practical",
    "plan_sampling_and_filtering",
    "plan_scan",
    "practical_selection",
    "sampling_and_filtering",
    "scan_selection",
    "scan_top_k",
    "sum_estimation",
    "variant_of",
]
