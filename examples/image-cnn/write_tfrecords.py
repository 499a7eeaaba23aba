"""Write image TFRecords for `shapes.model` from numpy arrays: training records and held-back validation records.

    python write_tfrecords.py OUT_DIR [--examples 20000] [--shards 4] [--seed 1] [--validation 0.1]
    python write_tfrecords.py OUT_DIR --npz my_images.npz   # arrays `images` (N,32,32[,1]) uint8, `labels` (N,)

The last `--validation` share of the examples is held back: `OUT_DIR/validation/`, never
trained on; the rest is `OUT_DIR/train/`. Upload OUT_DIR to your bucket (`aws s3 sync OUT_DIR
s3://BUCKET/data/shapes/`) and set `run.dataUri` to its `train/` folder and `run.validationDataUri`
to its `validation/` folder, or train locally with `--data-uri file://OUT_DIR/train
--validation-data-uri file://OUT_DIR/validation`.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes.data import SIZE, make_images  # noqa: E402 - this folder is the user's code root


def example(image: np.ndarray, label: int) -> bytes:
    """One serialized tf.train.Example with the features `shapes.model.FEATURES` reads."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.astype(np.uint8).tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(out_dir: str, images: np.ndarray, labels: np.ndarray, shards: int, name: str = "train") -> list[str]:
    """Write the arrays as `shards` files `<name>-0000i-of-0000n.tfrecord`; returns their paths."""
    if images.ndim == 3:
        images = images[..., None]
    if images.shape[1:] != (SIZE, SIZE, 1) or len(images) != len(labels):
        raise SystemExit(f"expected images (N,{SIZE},{SIZE}[,1]) and N labels, got {images.shape} and {labels.shape}")
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for s in range(shards):
        path = os.path.join(out_dir, f"{name}-{s:05d}-of-{shards:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(s, len(images), shards):
                w.write(example(images[i], labels[i]))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--npz", help="numpy file with arrays `images` and `labels` (default: generate shapes)")
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--validation", type=float, default=0.1, help="share of the examples held back for validation")
    a = p.parse_args(argv)
    if a.npz:
        arrays = np.load(a.npz)
        images, labels = arrays["images"], arrays["labels"]
    else:
        images, labels = make_images(a.examples, a.seed)
    if not 0 <= a.validation < 1:
        raise SystemExit(f"--validation {a.validation}: expected a share in [0, 1)")
    held = int(round(len(images) * a.validation))
    cut = len(images) - held
    paths = write(os.path.join(a.out_dir, "train"), images[:cut], labels[:cut], a.shards)
    if held:
        paths += write(os.path.join(a.out_dir, "validation"), images[cut:], labels[cut:], 1, name="validation")
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
