"""A PyTorch training loop over streamrec: DataLoader workers, epochs, checkpoint and resume.

    pip install torch            # (CPU is enough)
    python examples/training_loop.py [URL_OR_GLOB]

With no argument it writes 8 local shards of labelled 8x8 "images" first. It trains a tiny
linear classifier for two epochs with a 2-worker DataLoader (each worker streams its own
shards; records are decoded into numpy batches inside the workers), then shows exact resume:
a single-process loader stops mid-epoch, saves ``state_dict()`` into the checkpoint, and a
fresh dataset continues with exactly the remaining batches.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

import streamrec
import streamrec.torch
from streamrec.example import FixedLenFeature, RawFeature, encode

SPEC = {"image": RawFeature(np.uint8, (8, 8)), "label": FixedLenFeature(np.int64)}


def write_shards(directory: Path, shards: int = 8, records: int = 500) -> str:
    rng = np.random.default_rng(0)
    for shard in range(shards):
        with streamrec.sync.open_writer(str(directory / f"train-{shard:03d}.tfrecord")) as w:
            for _ in range(records):
                label = int(rng.integers(4))
                image = rng.integers(0, 40, (8, 8), dtype=np.uint8)
                image[2 * label : 2 * label + 2] += 200  # the label is the bright rows
                w.write(encode({"image": image.tobytes(), "label": label}))
    return str(directory / "train-*.tfrecord")


def make_dataset(url: str) -> streamrec.torch.IterableDataset:
    ds = streamrec.open_dataset(url, cycle_length=4, shuffle_buffer=1_000, seed=7)
    return streamrec.torch.IterableDataset(ds.parse(SPEC).batch(64))


def to_tensors(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    # the DataLoader turned streamrec's numpy arrays into tensors (without copying)
    images = batch["image"].reshape(len(batch["label"]), -1).float() / 255
    return images, batch["label"]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="streamrec-train-") as tmp:
        url = sys.argv[1] if len(sys.argv) > 1 else write_shards(Path(tmp))
        model = torch.nn.Linear(64, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        data = make_dataset(url)
        # batches are already stacked by streamrec: batch_size=None passes them through
        loader = DataLoader(data, batch_size=None, num_workers=2)
        for epoch in range(2):
            data.set_epoch(epoch)
            correct = seen = 0
            for batch in loader:
                images, labels = to_tensors(batch)
                logits = model(images)
                loss = torch.nn.functional.cross_entropy(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                correct += int((logits.argmax(1) == labels).sum())
                seen += len(labels)
            print(f"epoch {epoch}: {seen} records, accuracy {correct / seen:.3f}")

        # Exact resume (single-process loader): stop after 10 batches, checkpoint, continue.
        first = make_dataset(url)
        head = []
        for number, batch in enumerate(DataLoader(first, batch_size=None)):
            head.append(batch["label"])
            if number == 9:
                break
        checkpoint = {"model": model.state_dict(), "data": first.state_dict()}
        resumed = make_dataset(url)
        resumed.load_state_dict(checkpoint["data"])
        tail = [batch["label"] for batch in DataLoader(resumed, batch_size=None)]
        reference = [batch["label"] for batch in DataLoader(make_dataset(url), batch_size=None)]
        assert all(torch.equal(a, b) for a, b in zip(head + tail, reference, strict=True))
        print(f"resumed after {len(head)} batches: {len(tail)} more, identical to one run")


if __name__ == "__main__":
    main()
