"""Steady-state checkpoint overhead, measured side by side in ONE run.

Trains with the real trainer's step and save path (``Trainer._step`` / ``Trainer._save``: RNG
gather, staging copy, background persist with SHA-256, manifest, retention) and alternates
short segments with saving OFF and saving ON in ABBA order (off, on, on, off, ...), so drifts of a
shared machine hit both alike. Saves fall every ``--interval-s`` seconds of time spent ON, so the ON
segments together see exactly the save rate of a run at that interval; a persist still in flight at
the end of an ON segment is waited for and charged to ON. Prints::

    overhead ratio = (seconds per step, saving on) / (seconds per step, saving off)

over the whole run, the median of the per-block ratios (robust to a burst of load from other
processes hitting one segment), and the same ratio in process CPU seconds (which other tenants of a
shared machine barely disturb; it counts the persist thread's hashing and writing in full)

plus the blocking stall per save and the background persist time. The first save (buffer
allocation) happens before measuring.

Examples::

    python benchmarks/checkpoint_overhead.py                                # small CNN on MNIST
    python benchmarks/checkpoint_overhead.py --model resnet18 --dataset synthetic-cifar
    python benchmarks/checkpoint_overhead.py --model resnet18 --dataset synthetic-imagenet \\
        --batch-size 256 --checkpoint-uri s3://bucket/bench                    # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ratio(segments: list[tuple[str, float, float, int]], column: int) -> float:
    """(seconds per step with saving ON) / (seconds per step with saving OFF); ``column`` 1 = wall, 2 = CPU."""
    per_step = {}
    for mode in ("on", "off"):
        rows = [seg for seg in segments if seg[0] == mode]
        per_step[mode] = sum(r[column] for r in rows) / max(1, sum(r[3] for r in rows))
    return per_step["on"] / per_step["off"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--dataset", default="mnist", help="a prepare_dataset source")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--interval-s", type=float, default=30.0, help="seconds between saves when ON (<= 30)")
    p.add_argument("--segment-s", type=float, default=5.0, help="length of each ON/OFF segment")
    p.add_argument("--pairs", type=int, default=48, help="ON/OFF segment pairs (ABBA order)")
    p.add_argument("--verbose", action="store_true", help="print every segment")
    p.add_argument("--checkpoint-uri", default="", help="default: a temporary folder")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()

    import torch

    from components.training.config import CheckpointConfig, DataConfig, ModelConfig, TrainConfig
    from components.training.data import epoch_permutation, global_batch, shard
    from components.training.distributed import DistEnv
    from components.training.sources import prepare
    from components.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="tf-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        prepare(args.dataset, data_dir)
        cfg = TrainConfig(
            data=DataConfig(path=str(data_dir), global_batch_size=args.batch_size),
            model=ModelConfig(name=args.model),
            checkpoint=CheckpointConfig(uri=args.checkpoint_uri or str(Path(tmp) / "ckpt"), job_key="bench",
                                        interval_s=args.interval_s, keep_last_k=2),
            epochs=1000, deterministic=False, threads_per_rank=args.threads,
        )
        trainer = Trainer(cfg, DistEnv.from_env())
        device = trainer.device
        perm = epoch_permutation(trainer.num_samples, 0, 0)
        pos = 0

        def one_step() -> None:
            nonlocal pos
            if pos >= trainer.num_samples:
                pos = 0
            ids = shard(global_batch(perm, pos, args.batch_size), 0, 1)
            x, y = trainer.train_split.fetch(ids)
            trainer._step(x, y, len(ids))
            trainer.state.advance(len(ids), trainer.num_samples)
            pos += len(ids)
            if device.type == "cuda":
                torch.cuda.synchronize()

        for _ in range(5):  # warm up kernels and allocator
            one_step()
        trainer._save(blocking=True, reason="warm-up")  # allocate the staging buffers

        segments: list[tuple[str, float, float, int]] = []  # (mode, wall seconds, CPU seconds, steps)
        stalls: list[float] = []
        on_clock_s = 0.0  # seconds spent in ON segments so far: saves are due every interval_s of it
        next_save_on_s = args.interval_s / 2
        order = ["off", "on", "on", "off"] * ((args.pairs + 1) // 2)
        for i, mode in enumerate(order[: 2 * args.pairs]):
            t_seg, cpu_seg = time.perf_counter(), time.process_time()
            steps = 0
            while time.perf_counter() - t_seg < args.segment_s:
                one_step()
                steps += 1
                if mode == "on" and on_clock_s + time.perf_counter() - t_seg >= next_save_on_s:
                    stalls.append(trainer._save(blocking=False, reason="bench"))
                    next_save_on_s += args.interval_s
            if mode == "on":
                trainer.ckpt.wait()  # a persist still in flight is charged to saving, not to the next segment
                on_clock_s += time.perf_counter() - t_seg
            segments.append((mode, time.perf_counter() - t_seg, time.process_time() - cpu_seg, steps))
            if args.verbose:
                print(f"  {i:3d} {mode:>3}: {steps} steps in {segments[-1][1]:.2f} s", flush=True)
        trainer.ckpt.close()
        s = trainer.ckpt.stats
        ratio, cpu_ratio = _ratio(segments, 1), _ratio(segments, 2)
        block_ratios = [_ratio(segments[b : b + 4], 1) for b in range(0, len(segments) - 3, 4)]
        result = {
            "model": args.model, "dataset": args.dataset, "device": str(device),
            "batch_size": args.batch_size, "interval_s": args.interval_s, "segment_s": args.segment_s,
            "pairs": args.pairs, "overhead_ratio": ratio,
            "overhead_ratio_block_median": statistics.median(block_ratios) if block_ratios else None,
            "overhead_ratio_block_quartiles": statistics.quantiles(block_ratios, n=4) if len(block_ratios) > 1 else None,
            "cpu_overhead_ratio": cpu_ratio, "saves": len(stalls), "checkpoint_bytes": s.last_size_bytes,
            "stall_s_mean": statistics.mean(stalls) if stalls else None,
            "stall_s_max": max(stalls) if stalls else None,
            "persist_s_mean": s.persist_seconds_total / max(1, s.committed), "committed": s.committed,
            "skipped_in_flight": s.skipped_in_flight, "failed": s.failed, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        }
    print(json.dumps(result, indent=1))
    print(f"overhead ratio (on/off, wall seconds per step) = {ratio:.4f}; median over "
          f"{len(block_ratios)} ABBA blocks {result['overhead_ratio_block_median']:.4f}; "
          f"CPU seconds per step {cpu_ratio:.4f}   target <= 1.02 at a <= 30 s interval")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
