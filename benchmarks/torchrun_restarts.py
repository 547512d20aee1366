"""Kill/restart trials of the training entry point under plain torchrun, with torchrun's shared
rendezvous store (its default) and without it (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

Each trial runs ``torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m components.training`` on
the digits data with ``--fault-at-step`` (the last rank SIGKILLs itself once); a trial succeeds when
torchrun exits 0 after exactly one resume and the job reached its last step. Prints successes per
mode and the restart seconds (kill → first step after the resume, ``components.training.summary``).
pytorch#135712 (../shared/DESIGN.md §4) made restarts with the shared store unreliable before the
workers gave each worker group its own namespace in it.

    python benchmarks/torchrun_restarts.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def trial(data: Path, tmp: Path, *, shared: bool, fault_at: int) -> dict:
    from components.training.faults import fired_faults
    from components.training.metrics import read_jsonl
    from components.training.summary import summarize
    from trainflow.storage.local import LocalStorage

    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    if not shared:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    metrics = tmp / "metrics.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
         "3", "--monitor-interval", "0.2", "-m", "components.training", "--dataset", str(data), "--checkpoint-uri",
         str(tmp / "ckpt"), "--job-key", "trial", "--metrics-path", str(metrics), "--epochs", "2",
         "--global-batch-size", "32", "--threads-per-rank", "1", "--checkpoint-interval-steps", "10",
         "--fault-at-step", str(fault_at)], env=env, capture_output=True, text=True, timeout=600)
    s = summarize(read_jsonl(metrics), fired_faults(LocalStorage(str(tmp / "ckpt" / "trial"))))
    ok = proc.returncode == 0 and len(s.resumes) == 1 and s.steps == s.total_steps
    return {"ok": ok, "rc": proc.returncode, "resumes": len(s.resumes),
            "restart_s": s.resumes[0].restart_seconds if s.resumes else None,
            "error": "" if ok else proc.stderr.strip().splitlines()[-1:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from components.training.sources import prepare

    out = {}
    with tempfile.TemporaryDirectory(prefix="tf-restarts-") as tmp:
        data = Path(tmp) / "digits"
        prepare("digits", data, test_fraction=0.2, seed=0)
        for shared in (True, False):
            mode = "shared store" if shared else "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
            runs = []
            for i in range(args.trials):
                d = Path(tmp) / f"{int(shared)}-{i}"
                d.mkdir()
                runs.append(trial(data, d, shared=shared, fault_at=15 + 7 * i))
                print(mode, i, runs[-1], flush=True)
            times = [r["restart_s"] for r in runs if r["ok"] and r["restart_s"] is not None]
            out[mode] = {"succeeded": sum(r["ok"] for r in runs), "trials": len(runs),
                         "restart_s_median": statistics.median(times) if times else None,
                         "restart_s_max": max(times) if times else None}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
