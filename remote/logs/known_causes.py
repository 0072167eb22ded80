"""Errors whose cause and fix are known, told from a worker's exception and the words around it.

A script error's summary (remote/jobs/failure.py) and the folded traceback a front end shows
(traceback_fold.py) add the fix, so the user need not search for it. The table is short on purpose:
only errors a homegpu user meets for a reason homegpu can name.

Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from homegpu.trainer.gpu_budget import OVER_BUDGET

_NO_MODULE = re.compile(r"No module named '(?P<module>[^']+)'")
_OUT_OF_MEMORY = ("OOM when allocating", "CUDA_ERROR_OUT_OF_MEMORY", "RESOURCE_EXHAUSTED: Out of memory",
                  "CUDA out of memory")  # XLA's (TensorFlow's and JAX's), then PyTorch's torch.OutOfMemoryError
_OVER_BUDGET = re.compile(re.escape(OVER_BUDGET) + r" \(([^)]+)\)")  # trainer/gpu_budget.py's line after the traceback
_PORT_IN_USE = ("Address already in use", "Failed to add port", "Could not start gRPC server")


@dataclass(frozen=True)
class KnownCause:
    """What went wrong (`cause`) and what to do (`fix`), each a few words."""

    cause: str
    fix: str

    @property
    def words(self) -> str:
        return f"{self.cause}; fix: {self.fix}"


def _keras3_only(exception: str, text: str) -> KnownCause | None:
    if "is Keras 3-only" in text:
        return KnownCause('a Keras 3-only name under keras = "tf-keras"',
                          "write it with the Keras 2 API (tf_keras has no such name)")
    return None


def _keras3_per_replica(exception: str, text: str) -> KnownCause | None:
    if exception.startswith("ValueError") and "PerReplica" in text and "to a Tensor" in text:
        return KnownCause("Keras 3 under MultiWorkerMirroredStrategy",
                          'write `import tf_keras as keras` in the script, or set keras = "tf-keras" in the job')
    return None


def _missing_module(exception: str, text: str) -> KnownCause | None:
    found = _NO_MODULE.search(exception) if exception.startswith("ModuleNotFoundError") else None
    if found is None:
        return None
    module = found["module"].split(".")[0]
    return KnownCause(f"no module {module} where the worker runs",
                      f"install {module} in the node's python (or the job's Docker image)")


def out_of_memory(exception: str, text: str) -> bool:
    """Whether a worker's error (its exception line and what it printed) is its GPU running out of memory."""
    return exception.split(":", 1)[0].endswith("ResourceExhaustedError") or any(w in text for w in _OUT_OF_MEMORY)


def _out_of_memory(exception: str, text: str) -> KnownCause | None:
    if not out_of_memory(exception, text):
        return None
    budget = _OVER_BUDGET.search(text)
    if budget:
        return KnownCause(f"the run needed more GPU memory than its gpu_memory ({budget[1]})",
                          "raise gpu_memory in the job (or \"auto\" after a run on a card of its own), "
                          "or use a smaller batch")
    return KnownCause("the GPU ran out of memory", "use a smaller batch_size")


def _phrases(phrases: tuple[str, ...], cause: str, fix: str) -> Callable[[str, str], KnownCause | None]:
    """A rule that knows the cause when any of `phrases` is in what the worker printed."""
    def rule(exception: str, text: str) -> KnownCause | None:
        return KnownCause(cause, fix) if any(words in text for words in phrases) else None
    return rule


_port_in_use = _phrases(_PORT_IN_USE, "the job's port is already in use on the node",
                        "stop what holds it, or set another port in the job")

# PyTorch's distributed errors (torch.distributed, gloo, NCCL), as their messages say them.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
_nccl_without_gpu = _phrases(
    ("ProcessGroupNCCL is only supported with GPUs", "NCCL is not available", "Duplicate GPU detected",
     "no CUDA GPUs are available"),
    "the nccl backend in a process without a GPU",
    'write backend="nccl" if torch.cuda.is_available() else "gloo" in init_process_group')
_nccl_failed = _phrases(
    ("NCCL error", "ncclSystemError", "ncclUnhandledCudaError"), "NCCL failed between the GPUs",
    'add NCCL_DEBUG = "INFO" to the job\'s env to see why; consumer GPUs without P2P often need NCCL_P2P_DISABLE = "1"')
_rendezvous_timeout = _phrases(
    ("waiting for clients", "The client socket has timed out", "DistStoreError: Timed out", "Socket Timeout"),
    "a node never joined the rendezvous at the chief's port",
    "check that every node reaches the chief's job port (homegpu doctor, its reachable row)")


# JAX's coordination service (jax.distributed), whose fatal errors end the process from C++ with no traceback.
_JAX_FATAL = "JAX distributed service detected fatal errors"


def _jax_never_joined(exception: str, text: str) -> KnownCause | None:
    if "RegisterTask" in text and "DEADLINE_EXCEEDED" in text or "Barrier timed out" in text:
        return KnownCause("a JAX process never joined the coordinator at process 0's port",
                          "check that every node reaches the chief's job port (homegpu doctor, its reachable row); "
                          "a process that failed before jax.distributed.initialize() says why in its log")
    return None


def _jax_peer_gone(exception: str, text: str) -> KnownCause | None:
    if _JAX_FATAL in text:
        return KnownCause("another JAX process ended (its node's log says why)",
                          "read the other processes' logs; homegpu restarts the job when it can")
    return None


def _peer_gone(exception: str, text: str) -> KnownCause | None:
    if "gloo" in text and any(words in text for words in _PEER_GONE):
        return KnownCause("a peer process ended (its node's log says why)",
                          "read the other nodes' logs; homegpu restarts the job when it can")
    return None


# In order: the first that knows wins ("is Keras 3-only" may come as a ModuleNotFoundError).
_TABLE: tuple[Callable[[str, str], KnownCause | None], ...] = (
    _keras3_only, _keras3_per_replica, _missing_module, _out_of_memory, _port_in_use,
    _nccl_without_gpu, _nccl_failed, _rendezvous_timeout, _jax_never_joined, _jax_peer_gone, _peer_gone,
)


def known_cause(exception: str, context: str = "") -> KnownCause | None:
    """The known cause of an error, or None.

    Args:
        exception: its exception line, e.g. "ModuleNotFoundError: No module named 'foo'".
        context: more of what the worker printed: the message's other lines, its last log lines.
    """
    exception = exception.strip()
    text = f"{exception}\n{context}"
    for rule in _TABLE:
        cause = rule(exception, text)
        if cause is not None:
            return cause
    return None
