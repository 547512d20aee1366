"""Published results on the Pollux workloads, for side-by-side comparison.

Average JCT in seconds per workload and load, from the artifact's shipped raw results
(petuum/adaptdl@osdi21-artifact ``simulator/results-jobload/<policy>-<load>/summary.json``,
field ``avgs``; 64 GPUs = 16 nodes × 4, 60 s interval). Means over the 8 workloads match the
paper's Figure 8a and the artifact README (Pollux 2751 s, Tiresias 4038 s, Optimus 5682 s at 1.0x).
The p99 JCT (mean of per-workload p99s) and mean makespan at 1.0x come from the same files and
the workload submission times (see ../shared/research/scheduler.md §7.2–7.3).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PUBLISHED_AVG_JCT_S", "PUBLISHED_SUMMARY_1X", "published_mean"]

#: policy -> load -> workload number -> average JCT (s).
PUBLISHED_AVG_JCT_S: Mapping[str, Mapping[str, Mapping[int, float]]] = {
    "pollux": {
        "0.5": {1: 1059.51, 2: 1826.26, 3: 1310.53, 4: 1497.76, 5: 976.84, 6: 1287.83, 7: 2881.05, 8: 1432.04},
        "1.0": {1: 2088.77, 2: 3322.94, 3: 2188.49, 4: 2720.98, 5: 2673.70, 6: 2446.13, 7: 3616.14, 8: 2951.91},
        "1.5": {1: 3855.78, 2: 3380.58, 3: 3299.92, 4: 3902.68, 5: 4007.30, 6: 3474.27, 7: 3217.63, 8: 4345.12},
        "2.0": {1: 6186.26, 2: 4190.83, 3: 5131.84, 4: 5262.40, 5: 6590.82, 6: 5105.31, 7: 3836.32, 8: 6009.81},
    },
    "tiresias": {
        "0.5": {1: 1450.94, 2: 2333.28, 3: 1869.90, 4: 1946.76, 5: 1425.39, 6: 1826.58, 7: 3979.15, 8: 1899.95},
        "1.0": {1: 2473.65, 2: 5144.96, 3: 3876.26, 4: 3280.26, 5: 3501.01, 6: 3469.69, 7: 5479.91, 8: 5079.71},
        "1.5": {1: 5520.29, 2: 6333.77, 3: 6561.98, 4: 5577.32, 5: 6832.42, 6: 5830.48, 7: 5366.78, 8: 7435.75},
        "2.0": {1: 10138.17, 2: 8655.99, 3: 10727.82, 4: 9664.73, 5: 12098.10, 6: 10254.67, 7: 8370.85,
                8: 10405.81},
    },
    "optimus": {
        "0.5": {1: 1309.69, 2: 3124.56, 3: 1986.84, 4: 2173.86, 5: 1324.53, 6: 1957.96, 7: 5314.00, 8: 1971.47},
        "1.0": {1: 4087.06, 2: 6913.88, 3: 3944.01, 4: 5967.75, 5: 5656.25, 6: 5301.88, 7: 7290.86, 8: 6293.79},
        "1.5": {1: 7673.84, 2: 6678.19, 3: 5683.62, 4: 7683.79, 5: 7899.73, 6: 7500.25, 7: 6426.18, 8: 8331.30},
        "2.0": {1: 10806.60, 2: 8515.39, 3: 8363.36, 4: 10312.91, 5: 11830.04, 6: 9767.26, 7: 6997.97,
                8: 11174.79},
    },
}

#: policy -> {avg_jct_s, p99_jct_s, makespan_s} at 1.0x, means over the 8 workloads
#: (../shared/research/scheduler.md §7.3, "shipped results" rows).
PUBLISHED_SUMMARY_1X: Mapping[str, Mapping[str, float]] = {
    "pollux": {"avg_jct_s": 2751.0, "p99_jct_s": 40888.0, "makespan_s": 60268.0},
    "tiresias": {"avg_jct_s": 4038.0, "p99_jct_s": 54110.0, "makespan_s": 86858.0},
    "optimus": {"avg_jct_s": 5682.0, "p99_jct_s": 48682.0, "makespan_s": 67124.0},
}


def published_mean(policy: str, load: str = "1.0") -> float | None:
    """Mean over the 8 workloads of the published average JCT, or None if not published."""
    per = PUBLISHED_AVG_JCT_S.get(policy, {}).get(load)
    return sum(per.values()) / len(per) if per else None
