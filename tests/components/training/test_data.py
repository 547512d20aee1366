"""The elastic batch plan (pure): exactly-once per epoch for any sequence of world sizes; datasets."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from components.training import data as d
from components.training.sources import prepare, stratified_split


def test_permutation_is_a_pure_function_of_seed_and_epoch() -> None:
    a = d.epoch_permutation(100, seed=3, epoch=1)
    assert torch.equal(a, d.epoch_permutation(100, seed=3, epoch=1))
    assert not torch.equal(a, d.epoch_permutation(100, seed=3, epoch=2))
    assert sorted(a.tolist()) == list(range(100))


@pytest.mark.parametrize("world_sizes", [[2, 1, 2], [3], [1, 4, 3, 2], [5, 2]])
def test_every_sample_once_per_epoch_across_resizes(world_sizes) -> None:
    n, batch = 103, 8  # an epoch that does not divide evenly: the last batch is short
    perm = d.epoch_permutation(n, seed=0, epoch=0)
    seen = collections.Counter()
    pos, step = 0, 0
    while pos < n:
        world = world_sizes[min(step // 4, len(world_sizes) - 1)]  # resize every 4 steps
        gb = d.global_batch(perm, pos, batch)
        shards = [d.shard(gb, r, world) for r in range(world)]
        held = [len(s) for s in shards if len(s)]
        assert sum(len(s) for s in shards) == len(gb) and max(held) - min(held) <= 1
        if len(gb) >= 2 * world:
            assert len(held) == world  # a full batch: every rank
        for s in shards:
            seen.update(s.tolist())
        pos += len(gb)
        step += 1
    assert step == d.steps_per_epoch(n, batch) == 13
    assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}


@pytest.mark.parametrize(("n", "batch", "sizes"), [
    (17, 8, [8, 7, 2]),  # review 2026-11-30: never a last batch of one sample, never one above B
    (16, 8, [8, 8]), (18, 8, [8, 8, 2]), (1, 8, [1]), (3, 1, [1, 1, 1]), (9, 8, [7, 2]), (5, 2, [2, 2, 1]),
])
def test_no_epoch_ends_in_a_batch_of_one_sample(n: int, batch: int, sizes: list[int]) -> None:
    perm = d.epoch_permutation(n, seed=0, epoch=0)
    got, pos = [], 0
    while pos < n:
        gb = d.global_batch(perm, pos, batch)
        got.append(len(gb))
        pos += len(gb)
    assert got == sizes and d.steps_per_epoch(n, batch) == len(sizes)


def test_stratified_split_is_seeded_and_balanced() -> None:
    labels = np.repeat(np.arange(10), 50)
    train, test = stratified_split(labels, 0.2, seed=1)
    assert len(test) == 100 and np.all(np.bincount(labels[test]) == 10)
    assert set(train).isdisjoint(test) and len(train) + len(test) == 500
    assert np.array_equal(test, stratified_split(labels, 0.2, seed=1)[1])


def test_prepared_mnist_has_held_out_split_and_fingerprint(tmp_path) -> None:
    info = prepare("mnist", tmp_path / "m", seed=0)
    assert info.splits == {"train": 4000, "test": 1000} and info.image_size == (28, 28) and info.channels == 1
    again = prepare("mnist", tmp_path / "m2", seed=0)
    assert again.fingerprint == info.fingerprint
    assert prepare("mnist", tmp_path / "m3", seed=1).fingerprint != info.fingerprint  # another split
    ds = d.PreparedDataset(tmp_path / "m")
    x, y = ds.split("train").fetch(torch.tensor([0, 5]))
    assert x.shape == (2, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(float(ds.split("train").fetch(torch.arange(4000))[0].mean())) < 1e-3  # normalized



def test_a_keyed_split_keeps_its_samples_where_they_were_when_the_dataset_grows() -> None:
    """Review finding: an image folder was split by a seeded shuffle of its listing, so 40 images
    added to 200 moved about half of the old training images into the new test split, where the
    promotion step and the drift check scored the current model on data it had trained on."""
    keys = [f"c{i % 2}/{i}.png" for i in range(240)]
    labels = np.array([i % 2 for i in range(240)])
    for seed in range(5):
        train, _ = stratified_split(labels[:200], 0.2, seed, keys=keys[:200])
        grown_train, grown_test = stratified_split(labels, 0.2, seed, keys=keys)
        assert (len(grown_train), len(grown_test)) == (192, 48)  # the same per-class counts as before
        assert np.array_equal(grown_test, stratified_split(labels, 0.2, seed, keys=keys)[1])  # seeded
        moved = {keys[i] for i in train} & {keys[i] for i in grown_test}
        assert len(moved) <= 4, (seed, sorted(moved))  # only boundary samples (seeded shuffle: 21-30)
    # the listing's order does not matter, only the keys
    order = np.random.default_rng(0).permutation(240)
    _, shuffled_test = stratified_split(labels[order], 0.2, 1, keys=[keys[i] for i in order])
    assert {keys[order[i]] for i in shuffled_test} == {keys[i] for i in stratified_split(labels, 0.2, 1, keys=keys)[1]}

def test_image_folder_source(tmp_path) -> None:
    from PIL import Image

    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
    info = prepare(str(root), tmp_path / "p", test_fraction=0.2, image_size=16, channels=3)
    assert (
        info.kind == "imagefolder"
        and info.classes == ["cat", "dog"]
        and info.splits == {"train": 16, "test": 4}
    )
    x, y = d.PreparedDataset(tmp_path / "p").split("test").fetch(torch.arange(4))
    assert x.shape == (4, 3, 16, 16) and sorted(y.tolist()) == [0, 0, 1, 1]

    # Through DataLoader workers, with an epoch whose last batch (16 mod 7 = 2 samples, one rank's
    # pair: shard) leaves ranks 1 and 2 of 3 without samples: they get empty tensors, not a collate error.
    split = d.PreparedDataset(tmp_path / "p").split("train")
    perm = d.epoch_permutation(16, seed=0, epoch=0)
    for rank in range(3):
        steps = list(d.iter_local_batches(split, perm=perm, start=0, global_batch_size=7, rank=rank, world_size=3,
                                          loader_workers=1, loader_seed=0))
        assert [n for *_, n in steps] == [7, 7, 2]
        x_last, y_last, ids_last, _ = steps[-1]
        assert x_last.shape == ((2, 3, 16, 16) if rank == 0 else (0, 3, 16, 16)) and len(y_last) == len(ids_last)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("/no/such/folder", "does not exist"),
        ("gs://b/p", "unsupported dataset source"),
        ("imagenet", "unknown dataset source"),
    ],
)
def test_bad_sources_are_one_line_errors(tmp_path, source, message) -> None:
    with pytest.raises(d.DatasetError, match=message):
        prepare(source, tmp_path / "x")


def test_missing_dataset_folder(tmp_path) -> None:
    with pytest.raises(d.DatasetError, match="does not exist"):
        d.PreparedDataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(d.DatasetError, match="not a prepared dataset"):
        d.PreparedDataset(tmp_path / "empty")


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 16])
def test_no_rank_holds_a_single_sample_unless_the_batch_is_one(world) -> None:
    """BatchNorm in training mode refuses one sample on a 1x1 map: digits (1,438 samples) with a
    global batch of 64 ends each epoch with 30, which an even split over 16 ranks gave as 1 or 2."""
    for n in range(1, 3 * world + 2):
        batch = torch.arange(100, 100 + n)
        shards = [d.shard(batch, r, world) for r in range(world)]
        assert torch.equal(torch.cat(shards), batch)  # contiguous, in order, each sample once
        sizes = [len(s) for s in shards]
        assert all(size != 1 for size in sizes) if n >= 2 else sizes[0] == 1
        assert sizes == sorted(sizes, reverse=True) and sizes[0] >= 1  # the holders come first


def test_a_rank_without_samples_gets_a_two_sample_placeholder() -> None:
    perm = torch.arange(30)  # the last global batch of 64 over digits' 1,438: 30 samples
    dataset = list(range(30))
    steps = list(d.iter_task_batches(dataset, collate=lambda xs: xs, perm=perm, start=0, global_batch_size=64,
                                     rank=15, world_size=16, loader_workers=0, loader_seed=0))
    ((placeholder, ids, n),) = steps
    assert (placeholder, ids.tolist(), n) == ([0, 1], [], 30)


def _random_collate(samples: list) -> tuple:
    """A collate with randomness (augmentation, masking): one draw of each generator per batch."""
    import random

    return tuple(samples), float(torch.rand(())), float(np.random.rand()), random.random()


def _draws(*, rank: int, start: int, workers: int) -> list[tuple]:
    perm = d.epoch_permutation(64, seed=0, epoch=0)
    return [batch for batch, _, _ in d.iter_task_batches(list(range(64)), _random_collate, perm=perm, start=start,
                                                         global_batch_size=8, rank=rank, world_size=2,
                                                         loader_workers=workers, loader_seed=5)]


def test_loader_workers_draw_per_rank_and_a_resume_repeats_the_uninterrupted_draws() -> None:
    """Review finding: with DataLoader workers, a collate's random draws came from the workers' own
    seeds (the loader's base + worker id): the same on every rank, and started afresh by the loader
    a resume builds, so a resumed run drew other values than the uninterrupted one."""
    before = torch.get_rng_state()
    rank0, rank1 = _draws(rank=0, start=0, workers=2), _draws(rank=1, start=0, workers=2)
    assert len(rank0) == len(rank1) == 8
    for a, b in zip(rank0, rank1, strict=True):
        assert all(x != y for x, y in zip(a[1:], b[1:], strict=True)), (a, b)  # torch, NumPy, random: per rank
    assert len({draws[1:] for draws in rank0}) == 8  # and per batch
    assert _draws(rank=0, start=3 * 8, workers=2) == rank0[3:]  # a resume at batch 3
    assert _draws(rank=1, start=5 * 8, workers=2) == rank1[5:]
    assert _draws(rank=0, start=0, workers=1) == rank0  # whichever worker reads a batch
    assert torch.equal(torch.get_rng_state(), before)  # this process's stream is not consumed


def test_without_loader_workers_the_draws_are_this_processs_restored_stream() -> None:
    torch.manual_seed(11)
    np.random.seed(11)
    expected = [(float(torch.rand(())), float(np.random.rand())) for _ in range(8)]
    torch.manual_seed(11)
    np.random.seed(11)
    assert [draws[1:3] for draws in _draws(rank=0, start=0, workers=0)] == expected


def test_loader_workers_outlive_the_sigterm_torchrun_sends_to_the_whole_group() -> None:
    """Review 2026-11-30: torchrun stops a worker group with killpg(SIGTERM), which reached the
    DataLoader's worker processes too; their death raised "DataLoader worker ... killed by signal"
    in the trainer at any line, before or inside its preemption save (lost in 3 runs of 5). The
    workers ignore SIGTERM: the epoch reads on (the trainer, not the signal, ends them)."""
    import multiprocessing
    import os
    import signal

    perm = d.epoch_permutation(64, seed=0, epoch=0)
    batches = d.iter_task_batches(list(range(64)), _random_collate, perm=perm, start=0, global_batch_size=8,
                                  rank=0, world_size=1, loader_workers=2, loader_seed=5)
    first = next(batches)  # the workers have started (maybe not yet run their worker_init_fn)
    workers = multiprocessing.active_children()
    assert len(workers) == 2
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)
    rest = list(batches)
    assert len([first, *rest]) == 8 and all(w.exitcode in (None, 0) for w in workers)
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, set()) & {signal.SIGTERM}  # this process's mask as it was
