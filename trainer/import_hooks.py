"""`after_import(name, then)`: run `then()` right after a module is first imported, by whoever imports it.

homegpu sets what a framework takes only once it is loaded (TensorFlow's coordination timeout, JAX's cluster
environment, a GPU memory budget) without importing it itself, so whatever a script sets before its own import
still counts. Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, and `then()` once the module has run."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # what the module sees of itself
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then()` right after the top-level module `name` is first imported, by whoever imports it."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and the real finders answer the lookup below
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


def after_import(name: str, then: Callable[[], None]) -> None:
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
