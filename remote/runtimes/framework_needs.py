"""What a PyTorch or JAX job needs importable where its workers run: the import that proves it, the
distributions it stands on (import_check.py remembers a working import by them), what to install, and why every
node must run the same version. TensorFlow's needs are the built-in trainer's (process_runtime.py)."""

from __future__ import annotations

from dataclasses import dataclass

from homegpu.remote.config import FRAMEWORK_NAMES


@dataclass(frozen=True)
class FrameworkNeeds:
    framework: str  # the job's `framework`, and `homegpu image build --framework`'s
    what: str  # how a problem names it
    check: str  # a script that imports it and prints its version last
    dists: tuple[str, ...]  # the distributions `check` imports, as installed (a comma: either name)
    packages: str  # what `pip install` needs for it
    distribution: str  # whose version must agree between the nodes
    why_alike: str  # why it must

    @property
    def name(self) -> str:
        return FRAMEWORK_NAMES[self.framework]


# torch numpy: as the [pytorch] extra (torch warns without NumPy)
TORCH = FrameworkNeeds("pytorch", "PyTorch (torch.distributed)",
                       "import torch, torch.distributed; print(torch.__version__)", ("torch",), "torch numpy",
                       "torch", "DDP's processes must run one version")
JAX = FrameworkNeeds("jax", "JAX (jax.distributed)", "import jax, jax.distributed; print(jax.__version__)",
                     ("jax", "jaxlib"), "jax", "jax", "jax.distributed's processes must run one version")
NEEDS = {needs.framework: needs for needs in (TORCH, JAX)}


def version_mismatch(needs: FrameworkNeeds, node: str, versions: dict[str, str]) -> list[str]:
    """`node`'s problem when the nodes run different versions of `needs` (the first node names it once)."""
    known = {name: version for name, version in versions.items() if version}
    if len(set(known.values())) < 2 or node != next(iter(known)):
        return []
    listed = ", ".join(f"{version} on {name}" for name, version in known.items())
    pin = f"{needs.distribution}=={known[node].split('+')[0]}"
    return [f"{needs.distribution} differs between the nodes ({listed}): {needs.why_alike}; install the "
            f"same {needs.distribution} on every node (python -m pip install {pin})"]
