"""`import keras` that gives tf-keras: a script written for Keras 2's API trains under
MultiWorkerMirroredStrategy with no edit (Keras 3, TensorFlow's default `keras` since 2.16, cannot).

A finder first on sys.meta_path answers `keras` and every `keras.X` with the module `tf_keras.X`
itself, so `keras.layers.Dense is tf_keras.layers.Dense` and nothing is loaded twice. `keras` is a
thin module in front of tf_keras that says what happened when a script reaches for a name only
Keras 3 has (`keras.ops`, `keras.random`), instead of tf-keras's bare AttributeError.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types

# Top-level names of Keras 3.x that tf-keras 2.x lacks (compared on keras 3.15 and tf-keras 2.21).
KERAS3_ONLY = frozenset({
    "DTypePolicy", "FloatDTypePolicy", "Function", "Initializer", "InputSpec", "KerasTensor", "Layer", "Loss",
    "Metric", "Operation", "Optimizer", "Quantizer", "Regularizer", "RematScope", "StatelessScope",
    "SymbolicScope", "Variable", "config", "device", "distillation", "distribution", "dtype_policies", "legacy",
    "name_scope", "ops", "quantizers", "random", "remat", "tree", "version", "visualization", "wrappers",
})


def keras3_only_message(name: str) -> str:
    return (f"keras.{name} is Keras 3-only: this job runs tf-keras (keras = \"tf-keras\"), which has no "
            f"keras.{name}; write that part with the Keras 2 API (tf.keras), or drop keras = \"tf-keras\" "
            "and train without MultiWorkerMirroredStrategy")


class KerasFront(types.ModuleType):
    """The `keras` module a script sees: tf_keras's names, and a clear error for Keras 3-only ones."""

    def __init__(self, target: types.ModuleType) -> None:
        super().__init__("keras", target.__doc__)
        self.__dict__["_target"] = target
        self.__path__ = list(getattr(target, "__path__", []))  # a package: `import keras.layers` works

    def __getattr__(self, name: str):
        try:
            return getattr(self._target, name)
        except AttributeError:
            if name in KERAS3_ONLY:
                raise AttributeError(keras3_only_message(name)) from None
            raise

    def __dir__(self) -> list[str]:
        return dir(self._target)


class KerasToTfKeras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `keras` and `keras.X` as tf-keras's modules (the loader hands back the one already loaded)."""

    def __init__(self) -> None:
        self._specs: dict[str, object] = {}  # tf_keras.X's own spec, which the import system overwrites

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname == "keras" or fullname.startswith("keras."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec) -> types.ModuleType:
        if spec.name == "keras":
            return KerasFront(importlib.import_module("tf_keras"))
        first = spec.name.split(".")[1]
        try:
            module = importlib.import_module("tf_keras" + spec.name[len("keras"):])
        except ModuleNotFoundError:
            if first in KERAS3_ONLY:
                raise ModuleNotFoundError(keras3_only_message(first), name=spec.name) from None
            raise ModuleNotFoundError(f"No module named {spec.name!r} (tf-keras has no "
                                      f"tf_keras{spec.name[len('keras'):]})", name=spec.name) from None
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run (tf-keras's module ran when it was imported): give it back its own spec."""
        own = self._specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own


def use_tf_keras_for_keras() -> None:
    """From now on `import keras` in this process gives tf-keras. Call it before the script runs."""
    if not any(isinstance(finder, KerasToTfKeras) for finder in sys.meta_path):
        sys.meta_path.insert(0, KerasToTfKeras())
    for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
        del sys.modules[name]  # imported before (by TensorFlow itself, say): the script must get tf-keras
