"""Training data as tf.data pipelines that MultiWorkerMirroredStrategy can shard.

Three sources: the synthetic set (synthetic.py), an mnist-format .npz, and a directory of class
folders of images (decoded as the pipeline runs, not loaded up front). Images come out as float32
pixel values 0..255; the models rescale, so a saved model takes plain pixels.

Every pipeline is shuffled with a fixed seed (the same order on every worker), repeated, batched
with the GLOBAL batch size and sharded with AutoShardPolicy.DATA: each worker then gets distinct
batches of its per-worker size, and with a fixed steps_per_epoch all workers run the same number
of steps, which collective training needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from homegpu.trainer import synthetic

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
SHUFFLE_BUFFER = 10_000


class DataError(ValueError):
    """The data source cannot be read or is not in the expected format."""


@dataclass
class Datasets:
    """Ready-to-fit pipelines (global batches) and what the model needs to know about them."""

    train: tf.data.Dataset
    train_examples: int
    input_shape: tuple[int, int, int]
    num_classes: int
    validation: tf.data.Dataset | None = None
    validation_examples: int = 0
    examples: tf.data.Dataset | None = None  # the training examples one by one, unshuffled (balance_tf.py cuts them)
    decode: Callable | None = None  # what turns one of `examples` into an (image, label) pair, where it must


def load(kind: str, path: str = "", *, global_batch: int, seed: int, image_size: int = 32,
         samples: int = 6144) -> Datasets:
    """Build the pipelines for `kind` (synthetic, npz or dir) at `path`.

    Synthetic data is `samples` training images plus a held-out eighth for validation; an npz
    validates on x_test/y_test when it has them; a directory has no validation split.

    Raises:
        DataError: the source is missing or malformed.
    """
    if kind == "synthetic":
        x, y = synthetic.make_images(samples, image_size=image_size, seed=seed)
        held_out = synthetic.make_images(max(global_batch, samples // 8), image_size=image_size,
                                         seed=seed + 1_000_003)
        return _from_arrays((x, y), held_out, synthetic.NUM_CLASSES, global_batch, seed)
    if kind == "npz":
        train, test = read_npz(path)
        num_classes = int(max(train[1].max(), test[1].max() if test else 0)) + 1
        return _from_arrays(train, test, num_classes, global_batch, seed)
    if kind == "dir":
        return _from_directory(path, global_batch, seed, image_size)
    raise DataError(f"unknown data source {kind!r}: use synthetic, npz:PATH or dir:PATH")


def read_npz(path: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """(x_train, y_train) and (x_test, y_test) or None, from a keras.datasets-style .npz.

    Grayscale [n, h, w] images get a channel axis; labels are flattened to int64 (CIFAR's are
    [n, 1]). Raises DataError if the file or its arrays are missing or inconsistent.
    """
    try:
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if "x_train" not in arrays or "y_train" not in arrays:
        raise DataError(f"{path} needs arrays x_train and y_train (found: {', '.join(arrays) or 'none'})")
    train = _images_labels(arrays["x_train"], arrays["y_train"], path, "train")
    test = None
    if "x_test" in arrays and "y_test" in arrays:
        test = _images_labels(arrays["x_test"], arrays["y_test"], path, "test")
        if test[0].shape[1:] != train[0].shape[1:]:
            raise DataError(f"{path}: x_test images are {test[0].shape[1:]}, x_train {train[0].shape[1:]}")
    return train, test


def _images_labels(x: np.ndarray, y: np.ndarray, path: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[-1] not in (1, 3, 4):
        raise DataError(f"{path}: x_{split} must be [n, h, w] or [n, h, w, channels], got {x.shape}")
    y = np.asarray(y).reshape(-1)
    if len(y) != len(x) or len(x) == 0:
        raise DataError(f"{path}: x_{split} has {len(x)} images but y_{split} {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
        raise DataError(f"{path}: y_{split} must hold class numbers 0, 1, 2, ...")
    if np.issubdtype(x.dtype, np.floating) and x.size and float(x.max()) <= 1.0:
        x = x * 255.0  # already scaled to [0, 1]: back to pixel values, which the models expect
    return x, y.astype(np.int64)


def to_float(images: tf.Tensor) -> tf.Tensor:
    return tf.cast(images, tf.float32)


def _from_arrays(train, test, num_classes: int, global_batch: int, seed: int) -> Datasets:
    x, y = train
    examples = tf.data.Dataset.from_tensor_slices((x, y))
    train_ds = _finish(examples, global_batch, seed, shuffle=True)
    val_ds = None
    if test is not None:
        val_ds = _finish(tf.data.Dataset.from_tensor_slices(test), global_batch, seed, shuffle=False)
    return Datasets(train=train_ds, train_examples=len(x), input_shape=tuple(x.shape[1:]),
                    num_classes=num_classes, validation=val_ds,
                    validation_examples=len(test[0]) if test is not None else 0, examples=examples)


def _finish(ds: tf.data.Dataset, global_batch: int, seed: int, *, shuffle: bool,
            decode=None) -> tf.data.Dataset:
    """Shuffle (seeded: same order on every worker), repeat, batch globally, shard by DATA."""
    if shuffle:
        ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    if decode is not None:
        ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(global_batch, drop_remainder=True)
    ds = ds.map(lambda images, labels: (to_float(images), labels), num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def list_image_folders(root: str) -> tuple[list[str], list[int], list[str]]:
    """(file paths, labels, class names) of a directory of class folders, sorted by name.

    Raises DataError when `root` is missing, has fewer than two class folders, or no images.
    """
    if not os.path.isdir(root):
        raise DataError(f"{root} is not a directory")
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if len(classes) < 2:
        raise DataError(f"{root} needs one folder per class (at least two), found {len(classes)}")
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for entry in sorted(os.listdir(folder)):
            if entry.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(folder, entry))
                labels.append(label)
    if not paths:
        raise DataError(f"{root} has no images ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return paths, labels, classes


def _from_directory(root: str, global_batch: int, seed: int, image_size: int) -> Datasets:
    paths, labels, classes = list_image_folders(root)

    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image = tf.image.resize(image, (image_size, image_size))  # float32, still 0..255
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8), label

    files = tf.data.Dataset.from_tensor_slices((paths, np.asarray(labels, dtype=np.int64)))
    train = _finish(files, global_batch, seed, shuffle=True, decode=decode)
    return Datasets(train=train, train_examples=len(paths), input_shape=(image_size, image_size, 3),
                    num_classes=len(classes), examples=files, decode=decode)
