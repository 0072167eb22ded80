"""Training data for the built-in trainer: synthetic (no download), mnist-format .npz, or class folders.

Everything loads into numpy arrays first (images uint8 [N, H, W, C], labels int64 [N]); the model
rescales. That keeps one code path for sharding across workers, whatever the source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from homegpu.trainer.synthetic import NUM_CLASSES, make_images

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


class DataError(ValueError):
    """The data source is missing or not in the expected format; the message says which and why."""


@dataclass(frozen=True)
class Dataset:
    images: np.ndarray
    labels: np.ndarray
    num_classes: int
    description: str

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]


def load(source: str, *, image_size: int = 32, samples: int = 4096, seed: int = 0) -> Dataset:
    """`synthetic`, `npz:PATH` or `dir:PATH` into a Dataset. Raises DataError."""
    kind, _, path = source.partition(":")
    if kind == "synthetic":
        images, labels = make_images(samples, image_size=image_size, seed=seed)
        return Dataset(images, labels, NUM_CLASSES, f"synthetic: {samples} images {image_size}x{image_size}")
    if kind == "npz" and path:
        return load_npz(os.path.expanduser(path))
    if kind == "dir" and path:
        return load_directory(os.path.expanduser(path), image_size)
    raise DataError(f"unknown data source {source!r}: use synthetic, npz:PATH or dir:PATH")


def load_npz(path: str) -> Dataset:
    """A keras.datasets.mnist-style file: x_train [N, H, W] or [N, H, W, C] and y_train [N]."""
    try:
        with np.load(path) as data:
            images, labels = data["x_train"], data["y_train"]
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (KeyError, ValueError, OSError) as exc:
        raise DataError(f"{path}: not an mnist-format .npz with x_train and y_train ({exc})") from None
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or len(images) != len(labels):
        raise DataError(f"{path}: x_train must be [N, H, W(, C)] with one y_train label per image")
    labels = labels.astype(np.int64).reshape(-1)
    return Dataset(images.astype(np.uint8), labels, int(labels.max()) + 1, f"npz: {path} ({len(labels)} images)")


def load_directory(path: str, image_size: int) -> Dataset:
    """One sub-folder per class (sorted names are the class ids), images resized to a square."""
    import tensorflow as tf

    if not os.path.isdir(path):
        raise DataError(f"{path}: no such directory")
    classes = sorted(entry for entry in os.listdir(path) if os.path.isdir(os.path.join(path, entry)))
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(path, name)
        for file in sorted(os.listdir(folder)):
            if file.lower().endswith(IMAGE_SUFFIXES):
                raw = tf.io.read_file(os.path.join(folder, file))
                image = tf.io.decode_image(raw, channels=3, expand_animations=False)
                images.append(tf.image.resize(image, (image_size, image_size)).numpy().astype(np.uint8))
                labels.append(label)
    if len(classes) < 2 or not images:
        raise DataError(f"{path}: needs at least two class folders with images in them")
    return Dataset(np.stack(images), np.array(labels, dtype=np.int64), len(classes),
                   f"dir: {path} ({len(images)} images, {len(classes)} classes)")
