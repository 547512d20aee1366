"""The training entry point on this machine's GPU: one check run per case, under plain torchrun.

Each case runs ``torchrun --standalone --nproc-per-node 1 -m components.training`` with the trainer's
defaults (the main job's: small CNN, 8 epochs, global batch size 64, a checkpoint every 20 steps)
unless the case says otherwise, then evaluates the exported model on the test split:

* ``mnist`` — the main job's data (MNIST, 5,000 digits), fixed global batch;
* ``mnist-adaptive`` — the same with ``--adaptive-batch`` (the batch re-picked by goodput);
* ``mnist-fault`` — the same as ``mnist`` with ``--fault-at-step 250``: the worker SIGKILLs itself
  once and torchrun restarts it from the last checkpoint (restart seconds: kill → first step);
* ``mnist-fp16`` / ``mnist-fp16-adaptive`` — the main job in fp16 autocast with the gradient scaler
  (the adaptive mode un-scales its noise-scale norms by the scaler's scale);
* ``resnet18-bf16-adaptive`` — ResNet-18 at 32×32 as below, bf16 autocast, adaptive;
* ``resnet18`` / ``resnet18-adaptive`` — ResNet-18 on synthetic CIFAR-shaped data (32×32), global
  batch 128, 3 epochs, fixed and adaptive;
* ``resnet18-imagenet`` / ``resnet18-imagenet-adaptive`` — the same on synthetic ImageNet-shaped
  data (224×224, 6,400 samples), 2 epochs.

One rank: torchrun's workers map to GPUs by local rank, and NCCL refuses two ranks on one device, so
a one-GPU machine checks the CUDA device, the ``cpu:gloo,cuda:nccl`` process group (a one-rank NCCL
communicator) and the restart path, not multi-GPU scaling. On a machine without a GPU the same
cases run on the CPU with gloo (``--quick`` shortens them, to check this script, and saves the
fault case's checkpoints by steps only).

Prints one JSON line per case and writes all of them to ``--json``: exit status, device, backend,
steps, seconds from the first to the last step, the summed step times and samples per second of
them, test accuracy, the global batch sizes chosen, resumes with their restart seconds (and, for a
case with resumes, its checkpoint and resume records in order: where each save landed).

    python benchmarks/gpu_training_check.py --data /tmp/gpu-check-data --json result.json
    python benchmarks/gpu_training_check.py --prepare-only --data build/gpu-check-data   # then carry it
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {
    "mnist": ("mnist", []),
    "mnist-adaptive": ("mnist", ["--adaptive-batch"]),
    "mnist-fault": ("mnist", ["--fault-at-step", "250"]),
    "resnet18": ("synthetic-cifar", ["--model-name", "resnet18", "--global-batch-size", "128", "--epochs", "3"]),
    "resnet18-adaptive": ("synthetic-cifar", ["--model-name", "resnet18", "--global-batch-size", "128", "--epochs", "3",
                                              "--adaptive-batch"]),
    "mnist-fp16": ("mnist", ["--amp", "fp16"]),
    "mnist-fp16-adaptive": ("mnist", ["--amp", "fp16", "--adaptive-batch"]),
    "resnet18-bf16-adaptive": ("synthetic-cifar", ["--model-name", "resnet18", "--global-batch-size", "128",
                                                   "--epochs", "3", "--amp", "bf16", "--adaptive-batch"]),
    "resnet18-imagenet": ("synthetic-imagenet:6400", ["--model-name", "resnet18", "--global-batch-size", "128",
                                                      "--epochs", "2"]),
    "resnet18-imagenet-adaptive": ("synthetic-imagenet:6400", ["--model-name", "resnet18", "--global-batch-size",
                                                               "128", "--epochs", "2", "--adaptive-batch"]),
}


#: The records (and their fields) a case with resumes reports as ``checkpoint_records``, in order.
CHECKPOINT_EVENTS = frozenset({"checkpoint", "checkpoint_deferred", "checkpoint_committed", "checkpoint_failed",
                               "resume"})
CHECKPOINT_FIELDS = ("event", "step", "outcome", "reason", "persisting_step", "resumed_from_step")


def _folder(source: str) -> str:
    return source.replace(":", "-")  # a plain file name (the GPU machine's transfers want one)


def prepare_data(data: Path) -> None:
    from components.training.sources import prepare

    for source in sorted({source for source, _ in CASES.values()}):
        if not (data / _folder(source)).is_dir():
            prepare(source, data / _folder(source), test_fraction=0.2, seed=0)


def run_case(name: str, data: Path, tmp: Path, quick: bool) -> dict:
    import torch

    from components.training.distributed import process_group_backend
    from components.training.evaluation import evaluate
    from components.training.faults import fired_faults
    from components.training.metrics import read_jsonl
    from components.training.summary import summarize
    from trainflow.storage.local import LocalStorage

    source, extra = CASES[name]
    if quick:  # this script's own check on a CPU: a fraction of the work
        extra = [*extra, "--max-steps", "300" if name == "mnist-fault" else "40"]
        if name == "mnist-fault":  # saves by steps only: where a time-triggered one lands depends on the load
            extra = [*extra, "--checkpoint-interval-s", "0"]
    work = tmp / name
    metrics = work / "metrics.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts", "3",
           "--monitor-interval", "0.2", "-m", "components.training", "--dataset", str(data / _folder(source)),
           "--checkpoint-uri", str(work / "ckpt"), "--job-key", name, "--metrics-path", str(metrics),
           "--model-output", str(work / "model"), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - started
    records = read_jsonl(metrics) if metrics.exists() else []
    s = summarize(records, fired_faults(LocalStorage(str(work / "ckpt" / name))))
    batches = [r["global_batch_size"] for r in records if r.get("event") == "batch_size_chosen"]
    steps = [r for r in records if "loss" in r and "step" in r and "event" not in r]
    samples = sum(r["samples_per_s"] * r["step_seconds"] for r in steps)  # the global batch of each step
    step_s = sum(r["step_seconds"] for r in steps)
    span_s = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 and "time" in steps[0] else None
    out = {
        "case": name, "rc": proc.returncode, "wall_s": round(wall, 1),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "backend": process_group_backend(),
        "steps": s.steps, "total_steps": s.total_steps, "final_loss": s.final_loss,
        "first_to_last_step_s": None if span_s is None else round(span_s, 2), "step_time_s": round(step_s, 2),
        "samples_per_step_s": round(samples / step_s, 1) if step_s else None,
        "checkpoints": s.checkpoints_committed, "checkpoint_stall_s": round(s.checkpoint_stall_seconds_total, 3),
        "global_batch_sizes": sorted(set(batches)), "batch_changes": sum(
            1 for r in records if r.get("event") == "batch_size_chosen"
            and r["global_batch_size"] != r["previous_global_batch_size"]),
        "resumes": [{"killed_at_step": r.killed_at_step, "resumed_from_step": r.resumed_from_step,
                     "lost_steps": r.lost_steps, "restart_s": r.restart_seconds} for r in s.resumes],
    }
    if s.resumes:  # where each save landed around the restarts (a save deferred behind a slow persist moves)
        out["checkpoint_records"] = [{k: r[k] for k in CHECKPOINT_FIELDS if k in r} for r in records
                                     if r.get("event") in CHECKPOINT_EVENTS]
    if proc.returncode == 0 and (work / "model").is_dir():
        result = evaluate(work / "model", data / _folder(source))
        out["test_accuracy"] = round(result.accuracy, 4)
    else:
        out["stderr_tail"] = proc.stderr.strip().splitlines()[-5:]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="prepared datasets (made here if missing)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--case", action="append", choices=sorted(CASES), help="run these cases (default: all)")
    p.add_argument("--quick", action="store_true", help="a few steps per case (checks this script)")
    p.add_argument("--prepare-only", action="store_true", help="prepare the datasets and stop")
    args = p.parse_args()
    prepare_data(args.data)
    if args.prepare_only:
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="tf-gpu-check-") as tmp:
        for name in args.case or list(CASES):
            results.append(run_case(name, args.data, Path(tmp), args.quick))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
