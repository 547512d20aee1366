"""Checkpoint overhead with a 95 % confidence interval: the cost of one save, measured in paired
segments, turned into the overhead ratio at a save interval.

Method. Trains with the real trainer's step and save path (``Trainer._step`` / ``Trainer._save``: RNG
gather, staging copy, background persist with SHA-256, manifest, retention) on batches staged on the
device beforehand (no host input path in the timings). The run alternates paired segments of the
same ``N`` steps, in ABBA order (on, off, off, on, ...) so that drift hits both alike:

* **on**: one save at the segment's start, then ``N`` steps; if the persist is still running after
  them the segment waits for it (charged to saving);
* **off**: ``N`` steps.

``N`` is chosen from a calibration save so that the persist normally finishes inside the segment, so an
"on" segment holds the whole cost of one save: the blocking stall, and the slow-down of the steps that
run beside the persist thread (GIL, memory bandwidth, hashing). Segment times are device-side on CUDA
(CUDA events around the segment: GPU timestamps, idle gaps included) and wall-clock on CPU.

Per pair ``d = t_on - t_off`` is the extra seconds one save costs. Its mean gets a Student-t 95 %
interval over the pairs (a percentile bootstrap is printed beside it as a check). With periodic saves
every ``T`` seconds of wall-clock (``SaveSchedule``), each interval of ``T`` seconds does ``T - d``
seconds of saving-free work, so

    overhead ratio (seconds per step, saving on / off) = T / (T - d)

with the interval's endpoints mapped the same way (monotonic). This holds while a persist fits in
``T`` (else saves are skipped; the output flags it). It also prints the stall per save, the persist
time, and the checkpoint size. Targets: ratio <= 1.005 and a CI half-width <= 0.003.

Examples::

    python benchmarks/checkpoint_overhead.py --threads 1                       # small CNN, MNIST, CPU
    python benchmarks/checkpoint_overhead.py --model resnet18 --dataset synthetic-cifar:2000 \\
        --batch-size 32 --threads 1 --pairs 40
    # GPU: ResNet-18 and the ~1 GB Wide ResNet-101-2, fp32 and bf16, ImageNet-shaped batches
    python benchmarks/checkpoint_overhead.py --model resnet18,wide_resnet101_2 --amp off,bf16 \\
        --dataset synthetic-imagenet:1024 --batch-size 128 --pairs 60 --budget-s 95   # docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student-t interval of the mean."""
    from scipy import stats

    n = len(values)
    mean = statistics.fmean(values)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def bootstrap_interval(values: list[float], confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (Efron & Tibshirani 1993, ch. 13)."""
    rnd = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(rnd.choices(values, k=n)) for _ in range(resamples))
    lo = means[int((1 - confidence) / 2 * resamples)]
    hi = means[int((1 + confidence) / 2 * resamples) - 1]
    return lo, hi


def ratio_at(interval_s: float, extra_s: float) -> float:
    """Seconds per step with saving / without, for saves every ``interval_s`` costing ``extra_s`` each."""
    return interval_s / (interval_s - extra_s) if extra_s < interval_s else math.inf


class _Timer:
    """Segment timer: CUDA events on the current stream (device timestamps) or ``perf_counter``."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self.torch = torch

    def start(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, started) -> float:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            return started.elapsed_time(ev) / 1000.0
        return time.perf_counter() - started


def measure(args: argparse.Namespace, model: str, amp: str, data_dir: Path, tmp: Path) -> dict:
    import torch

    from components.training.data import epoch_permutation, global_batch, read_samples
    from components.training.distributed import DistEnv
    from components.training.trainer import Trainer
    from trainflow.common.training_spec import (
        CheckpointConfig,
        DataConfig,
        ModelConfig,
        OptimConfig,
        TrainConfig,
    )
    from trainflow.task import move_to_device

    cfg = TrainConfig(
        data=DataConfig(path=str(data_dir), global_batch_size=args.batch_size),
        model=ModelConfig(name=model), optim=OptimConfig(amp=amp),
        checkpoint=CheckpointConfig(uri=args.checkpoint_uri or str(tmp / "ckpt"), job_key=f"bench-{model}-{amp}",
                                    interval_steps=0, interval_s=0, keep_last_k=2),
        epochs=1000, deterministic=False, threads_per_rank=args.threads or 0,
    )
    trainer = Trainer(cfg, DistEnv.from_env())
    device = trainer.device
    cuda = device.type == "cuda"
    perm = epoch_permutation(trainer.num_samples, 0, 0)
    batches = []  # staged on the device once: the timings hold no host input path
    for i in range(args.staged_batches):
        ids = global_batch(perm, (i * args.batch_size) % max(1, trainer.num_samples - args.batch_size), args.batch_size)
        batch = trainer.task.collate(read_samples(trainer.train_data, ids.tolist()))  # as the trainer reads it
        batches.append((move_to_device(batch, device), len(ids)))
    cycle = itertools.cycle(batches)

    def steps(n: int) -> None:
        for _ in range(n):
            batch, n_global = next(cycle)
            trainer._step(batch, n_global, n_global)  # one process: the local batch is the global one
            trainer.state.advance(n_global, trainer.num_samples)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    timer = _Timer(cuda)
    steps(args.warmup_steps)
    trainer._save(blocking=True, reason="warm-up")  # allocates the (pinned) staging buffers
    sync()
    t = timer.start()
    steps(args.warmup_steps)
    step_s = timer.stop(t) / args.warmup_steps
    trainer._save(blocking=False, reason="calibration")
    t0 = time.perf_counter()
    trainer.ckpt.wait()
    persist_s = max(trainer.ckpt.stats.last_persist_seconds, time.perf_counter() - t0)
    n_steps = max(args.min_steps, math.ceil((persist_s * args.persist_margin + args.segment_pad_s) / step_s))

    stats0 = (trainer.ckpt.stats.committed, trainer.ckpt.stats.stall_seconds_total)
    stalls, extra, on_times, off_times, waited = [], [], [], [], 0
    started = time.perf_counter()
    for k in range(args.pairs):
        if k >= args.min_pairs and k % 2 == 0 and args.budget_s and time.perf_counter() - started > args.budget_s:
            break  # a fixed lease: fewer pairs (whole ABBA blocks); the interval says what they bought
        seg = {}
        for mode in (("on", "off") if k % 2 == 0 else ("off", "on")):
            sync()
            t = timer.start()
            if mode == "on":
                stalls.append(trainer._save(blocking=False, reason="bench"))
            steps(n_steps)
            if mode == "on" and not trainer.ckpt.wait(timeout_s=0):
                waited += 1
                trainer.ckpt.wait()
            seg[mode] = timer.stop(t)
        on_times.append(seg["on"])
        off_times.append(seg["off"])
        extra.append(seg["on"] - seg["off"])
        if args.verbose:
            print(f"  pair {k:3d}: on {seg['on']:.4f} s  off {seg['off']:.4f} s  extra {extra[-1] * 1e3:+.2f} ms",
                  flush=True)
    trainer.ckpt.close()
    s = trainer.ckpt.stats
    saves = s.committed - stats0[0]
    d_mean, d_lo, d_hi = t_interval(extra)
    b_lo, b_hi = bootstrap_interval(extra)
    out = {
        "model": model, "amp": amp, "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "batch_size": args.batch_size, "dataset": args.dataset, "pairs": len(extra), "steps_per_segment": n_steps,
        "step_s": statistics.fmean(off_times) / n_steps, "checkpoint_bytes": s.last_size_bytes,
        "stall_s_mean": statistics.fmean(stalls), "stall_s_max": max(stalls),
        "persist_s_mean": (s.persist_seconds_total) / max(1, s.committed), "saves": saves,
        "segments_waiting_for_persist": waited, "failed": s.failed, "skipped": s.skipped_in_flight,
        "extra_s_per_save": d_mean, "extra_s_per_save_ci95": [d_lo, d_hi], "extra_s_per_save_bootstrap_ci95": [b_lo, b_hi],
        "intervals": {},
    }
    for interval in args.intervals:
        r, lo, hi = ratio_at(interval, d_mean), ratio_at(interval, d_lo), ratio_at(interval, d_hi)
        out["intervals"][f"{interval:g}"] = {
            "overhead_ratio": r, "ci95": [lo, hi], "ci95_half_width": (hi - lo) / 2,
            "persist_fits_interval": out["persist_s_mean"] < interval,
            "meets_1_005": hi <= 1.005, "ci_half_width_meets_0_003": (hi - lo) / 2 <= 0.003,
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small_cnn", help="comma-separated: small_cnn, resnet18, wide_resnet101_2")
    p.add_argument("--amp", default="off", help="comma-separated: off, bf16")
    p.add_argument("--dataset", default="mnist", help="a prepare_dataset source (synthetic-imagenet:N on a GPU)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--intervals", default="30,10", help="save intervals (s) to report the ratio at")
    p.add_argument("--pairs", type=int, default=40, help="on/off segment pairs (ABBA order)")
    p.add_argument("--budget-s", type=float, default=0,
                   help="stop adding pairs after this many seconds per model and amp (0: no limit)")
    p.add_argument("--min-pairs", type=int, default=8, help="pairs measured whatever --budget-s says")
    p.add_argument("--min-steps", type=int, default=5, help="fewest steps per segment")
    p.add_argument("--persist-margin", type=float, default=1.5, help="segment >= margin x persist time + pad")
    p.add_argument("--segment-pad-s", type=float, default=0.5)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--staged-batches", type=int, default=8)
    p.add_argument("--checkpoint-uri", default="", help="default: a temporary folder")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--verbose", action="store_true", help="print every pair")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    args.intervals = [float(v) for v in args.intervals.split(",")]

    from components.training.sources import prepare

    results = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        prepare(args.dataset, data_dir)
        for model, amp in itertools.product(args.model.split(","), args.amp.split(",")):
            r = measure(args, model, amp, data_dir, Path(tmp))
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    print()
    print("| model | amp | device | checkpoint | step | stall per save, mean (max) | persist | extra per save (95 % CI) "
          "| interval | overhead ratio (95 % CI) | CI half-width |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        lo_d, hi_d = r["extra_s_per_save_ci95"]
        for interval, v in r["intervals"].items():
            lo, hi = v["ci95"]
            print(f"| {r['model']} | {r['amp']} | {r['device']} | {r['checkpoint_bytes'] / 1e6:.1f} MB "
                  f"| {r['step_s'] * 1e3:.1f} ms | {r['stall_s_mean'] * 1e3:.1f} ms ({r['stall_s_max'] * 1e3:.1f} ms) "
                  f"| {r['persist_s_mean']:.3f} s | {r['extra_s_per_save'] * 1e3:.1f} ms ({lo_d * 1e3:.1f} to {hi_d * 1e3:.1f}) "
                  f"| {interval} s | **{v['overhead_ratio']:.4f}** ({lo:.4f}-{hi:.4f}) | {v['ci95_half_width']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
