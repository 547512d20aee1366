"""KFP component ``prepare_dataset``: a source → a prepared dataset artifact + its fingerprint."""

from typing import NamedTuple

from kfp.dsl import Dataset, Output

from components.specs._image import component


@component
def prepare_dataset(
    dataset: Output[Dataset],
    source: str = "mnist",
    test_fraction: float = 0.2,
    seed: int = 0,
    image_size: int = 32,
    channels: int = 3,
    s3_endpoint_url: str = "",
) -> NamedTuple("PrepareOutputs", [("fingerprint", str), ("num_classes", int), ("train_samples", int)]):
    """Prepare ``source`` (mnist | digits | synthetic-imagenet[:N] | a folder | s3://bucket/prefix in
    ImageFolder layout) with a stratified, seeded held-out test split of ``test_fraction``.
    ``image_size``/``channels`` apply to image folders. Outputs the dataset folder and a SHA-256
    content fingerprint; a folder or prefix also gets its listing fingerprint (keys, sizes, ETags:
    trainflow/common/listing.py) in the artifact's metadata, taken before the images are read, and
    the data profile the drift check compares new data with (``data_profile.json``, read now: the
    register step, hours later, stores it with the model version as it was when the model trained)."""
    from collections import namedtuple

    from components.drift.check import source_listing
    from components.drift.profile import store_profile
    from components.training.sources import describe, prepare
    from components.training.step import use_s3_endpoint
    from trainflow.common.listing import listing_fingerprint

    use_s3_endpoint(s3_endpoint_url)

    listing = source_listing(source)
    info = prepare(source, dataset.path, test_fraction=test_fraction, seed=seed, image_size=image_size, channels=channels)
    dataset.metadata.update(describe(info))
    dataset.metadata.update({"source": source, "listing_fingerprint": listing_fingerprint(listing) if listing else ""})
    store_profile(dataset.path, listing_fingerprint=dataset.metadata["listing_fingerprint"])
    outputs = namedtuple("PrepareOutputs", ["fingerprint", "num_classes", "train_samples"])
    return outputs(info.fingerprint, info.num_classes, info.splits["train"])
