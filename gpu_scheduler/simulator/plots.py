"""PNG plots of simulation results (matplotlib, headless Agg backend).

One figure, two panels: the JCT CDF per policy (log-scaled JCT) and the GPUs in use over time
per policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

__all__ = ["plot_jct_and_usage"]


def plot_jct_and_usage(
    jcts_by_policy: Mapping[str, Sequence[float]],
    usage_by_policy: Mapping[str, Sequence[tuple[float, int]]],
    path: Path,
    *,
    total_gpus: int,
    title: str = "",
) -> Path:
    """Draw the JCT CDF and GPUs-in-use panels and save them as a PNG.

    Args:
        jcts_by_policy: JCTs in seconds per policy name (one CDF line each).
        usage_by_policy: ``(time_s, gpus)`` samples per policy name.
        path: Output PNG path (parents created).
        total_gpus: Cluster size (drawn as a reference line).
        title: Figure title.

    Returns:
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_cdf, ax_use) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, jcts in jcts_by_policy.items():
        x = np.sort(np.asarray(jcts, dtype=float))
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        ax_cdf.step(x, y, where="post", label=f"{name} (avg {x.mean():,.0f} s)")
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (s, log scale)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT CDF")
    ax_cdf.grid(True, which="both", alpha=0.3)
    if ax_cdf.lines:
        ax_cdf.legend(fontsize=8, loc="lower right")
    for name, samples in usage_by_policy.items():
        if not samples:
            continue
        t = np.array([s[0] for s in samples], dtype=float) / 3600.0
        g = np.array([s[1] for s in samples], dtype=float)
        ax_use.plot(t, g, label=name, linewidth=0.9)
    ax_use.axhline(total_gpus, color="grey", linestyle="--", linewidth=0.8)
    ax_use.set_xlabel("time (h)")
    ax_use.set_ylabel("GPUs in use")
    ax_use.set_title("GPUs in use over time")
    ax_use.grid(True, alpha=0.3)
    if any(not line.get_label().startswith("_") for line in ax_use.lines):
        ax_use.legend(fontsize=8, loc="upper right")
    else:  # usage is kept for one workload only (the report's plotted one), which did not run
        ax_use.text(0.5, 0.5, "no usage samples", transform=ax_use.transAxes, ha="center", va="center")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
