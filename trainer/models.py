"""The built-in models, in tf-keras (Keras 3 fails under MultiWorkerMirroredStrategy on TF 2.21)."""

from __future__ import annotations

import tf_keras as keras

from homegpu.trainer import MODELS


def build(name: str, input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """A compiled-ready (not compiled) classifier taking uint8-range images."""
    if name == "cnn":
        return small_cnn(input_shape, num_classes)
    if name == "resnet":
        return resnet(input_shape, num_classes)
    raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")


def small_cnn(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """Two conv blocks and a dense head: trains in seconds on a CPU, enough for the demo."""
    return keras.Sequential([
        keras.layers.Input(shape=input_shape),
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes),
    ], name="small_cnn")


def resnet(input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """ResNet-50 from scratch (no weights download), for real GPUs; images below 32 px are upscaled."""
    inputs = keras.layers.Input(shape=input_shape)
    x = keras.layers.Rescaling(1.0 / 127.5, offset=-1.0)(inputs)
    if input_shape[-1] != 3:
        x = keras.layers.Conv2D(3, 1)(x)
    if min(input_shape[:2]) < 32:
        x = keras.layers.Resizing(32, 32)(x)
    base = keras.applications.ResNet50(weights=None, include_top=False, input_shape=(*x.shape[1:3], 3))
    x = keras.layers.GlobalAveragePooling2D()(base(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="resnet50")
