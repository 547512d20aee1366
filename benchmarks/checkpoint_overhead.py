"""Steady-state checkpoint overhead, measured side by side in ONE run.

Trains with the real trainer's step and save path (``Trainer._step`` / ``Trainer._save``: RNG
gather, staging copy, background persist with SHA-256, manifest, retention) and alternates
segments with saving OFF and saving ON (a save every ``--interval-s`` seconds), in ABBA order so
slow drifts of a shared machine cancel out. Prints::

    overhead ratio = (seconds per step, saving on) / (seconds per step, saving off)

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--dataset", default="mnist", help="a prepare_dataset source")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--interval-s", type=float, default=30.0, help="seconds between saves when ON (<= 30)")
    p.add_argument("--segment-s", type=float, default=60.0, help="length of each ON/OFF segment")
    p.add_argument("--pairs", type=int, default=4, help="ON/OFF segment pairs (ABBA order)")
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

        totals = {"on": [0.0, 0], "off": [0.0, 0]}
        stalls: list[float] = []
        order = ["off", "on", "on", "off"] * ((args.pairs + 1) // 2)
        for mode in order[: 2 * args.pairs]:
            trainer.ckpt.wait()  # a segment starts with no persist in flight
            t_seg = time.perf_counter()
            next_save = t_seg + args.interval_s / 2 if mode == "on" else float("inf")
            steps = 0
            while time.perf_counter() - t_seg < args.segment_s:
                one_step()
                steps += 1
                if time.perf_counter() >= next_save:
                    stalls.append(trainer._save(blocking=False, reason="bench"))
                    next_save += args.interval_s
            totals[mode][0] += time.perf_counter() - t_seg
            totals[mode][1] += steps
            print(f"  {mode:>3}: {steps} steps in {time.perf_counter() - t_seg:.1f} s", flush=True)
        trainer.ckpt.close()
        s = trainer.ckpt.stats
        per_step = {m: t / max(1, n) for m, (t, n) in totals.items()}
        ratio = per_step["on"] / per_step["off"]
        result = {
            "model": args.model, "dataset": args.dataset, "device": str(device),
            "batch_size": args.batch_size, "interval_s": args.interval_s, "segment_s": args.segment_s,
            "pairs": args.pairs, "seconds_per_step_off": per_step["off"], "seconds_per_step_on": per_step["on"],
            "overhead_ratio": ratio, "saves": len(stalls), "checkpoint_bytes": s.last_size_bytes,
            "stall_s_mean": statistics.mean(stalls) if stalls else None,
            "stall_s_max": max(stalls) if stalls else None,
            "persist_s_mean": s.persist_seconds_total / max(1, s.committed), "committed": s.committed,
            "skipped_in_flight": s.skipped_in_flight, "failed": s.failed, "torch": torch.__version__,
        }
    print(json.dumps(result, indent=1))
    print(f"overhead ratio (on/off, seconds per step) = {ratio:.4f}   target <= 1.02 at <= 30 s interval")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
