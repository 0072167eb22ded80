"""homegpu as a cluster JAX finds: `jax.distributed.initialize()` with no arguments joins the run.

JAX reads only the coordinator's address from the environment (JAX_COORDINATOR_ADDRESS); the process count and
id come from a cluster environment it detects (Slurm, Open MPI, Kubernetes, a TPU pod: subclasses of its
`ClusterEnv`). homegpu is one more: `HomegpuCluster` answers from the variables homegpu gives each process, and
stands first, so a script written for a Slurm cluster runs unchanged (a Slurm allocation around homegpu's own
launch must not answer for it). Arguments the script passes still win, as they do for every cluster environment.

gloo, JAX's CPU collectives, finds its own address from the machine's hostname, which a home machine often maps
to 127.0.0.1 or 127.0.1.1: processes on two nodes then never reach each other. The process's cluster address
(HOMEGPU_JAX_ADDRESS) is given to gloo instead, and NCCL gets that address's interface, as trainer/torchrun.py
does for PyTorch.

`register()` runs once `jax` is imported (user_script.py arranges it for a script; the JAX demo calls it).
"""

from __future__ import annotations

import os
import sys

from homegpu.trainer.torchrun import interface_of

PROCESS_COUNT_ENV = "HOMEGPU_JAX_PROCESS_COUNT"
PROCESS_ID_ENV = "HOMEGPU_JAX_PROCESS_ID"
ADDRESS_ENV = "HOMEGPU_JAX_ADDRESS"  # this process's cluster address: what gloo and NCCL use
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"  # JAX's own: the chief's cluster address and the job's port


def in_run(env=os.environ) -> bool:
    """Whether homegpu started this process as part of a JAX run."""
    return PROCESS_ID_ENV in env


def register() -> None:
    """Make homegpu the cluster environment JAX detects first, and point gloo and NCCL at the cluster address.
    Both reach into JAX's private modules: a change there is said on stderr, and the script goes on (it may then
    pass its own arguments to initialize())."""
    try:
        _register_cluster()
    except Exception as exc:
        _say(f"JAX cannot find this run by itself ({type(exc).__name__}: {exc}); call jax.distributed.initialize() "
             f"with os.environ['{PROCESS_COUNT_ENV}'] and ['{PROCESS_ID_ENV}']")
    address = os.environ.get(ADDRESS_ENV, "")
    if not address:
        return
    interface = interface_of(address)
    if interface:
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    try:
        _gloo_on(address)
    except Exception as exc:
        _say(f"gloo keeps the address of this machine's hostname ({type(exc).__name__}: {exc}); if the "
             "processes never meet, map the hostname to the cluster address in /etc/hosts")


def _register_cluster() -> None:
    from jax._src import clusters

    class HomegpuCluster(clusters.ClusterEnv):
        name = "homegpu"

        @classmethod
        def is_env_present(cls) -> bool:
            return in_run()

        @classmethod
        def get_coordinator_address(cls, timeout_secs=None, override_coordinator_port=None) -> str:
            return os.environ[COORDINATOR_ENV]

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ[PROCESS_COUNT_ENV])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ[PROCESS_ID_ENV])

    types = clusters.ClusterEnv._cluster_types
    types.remove(HomegpuCluster)  # __init_subclass__ appended it: it goes first instead
    types.insert(0, HomegpuCluster)


def _gloo_on(address: str) -> None:
    """gloo's TCP collectives on `address` unless the caller names a host or interface itself."""
    from jax._src.lib import _jax

    make = _jax.make_gloo_tcp_collectives
    if getattr(make, "homegpu", False):
        return

    def on_cluster_address(distributed_client, hostname=None, interface=None):
        if hostname is None and interface is None:
            hostname = address
        return make(distributed_client=distributed_client, hostname=hostname, interface=interface)

    on_cluster_address.homegpu = True
    _jax.make_gloo_tcp_collectives = on_cluster_address


def _say(line: str) -> None:
    print(f"homegpu: {line}", file=sys.stderr, flush=True)
