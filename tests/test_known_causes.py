"""remote/logs/known_causes.py: the errors whose cause and fix homegpu can name, and those it cannot."""

from __future__ import annotations

import pytest

from homegpu.remote.logs.known_causes import known_cause

PER_REPLICA_LAST = ("}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) "
                    "to a Tensor.")


@pytest.mark.parametrize("exception, context, cause, fix", [
    ("ValueError: Attempt to convert a value (PerReplica:{", f"  0: <tf.Tensor ...>\n{PER_REPLICA_LAST}",
     "Keras 3 under MultiWorkerMirroredStrategy", 'import tf_keras as keras` in the script, or set keras = "tf-keras"'),
    ("AttributeError: keras.ops is Keras 3-only: this job runs tf-keras (keras = \"tf-keras\"), which has no keras.ops",
     "", 'Keras 3-only name under keras = "tf-keras"', "Keras 2 API (tf_keras has no such name)"),
    ("ModuleNotFoundError: keras.src is Keras 3-only: this job runs tf-keras (keras = \"tf-keras\"), which has no "
     "keras.src", "", "Keras 3-only", "Keras 2 API"),
    ("ModuleNotFoundError: No module named 'sklearn.model_selection'", "", "no module sklearn where the worker runs",
     "install sklearn in the node's python (or the job's Docker image)"),
    ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:", "",
     "the GPU ran out of memory", "smaller batch_size"),
    ("RuntimeError: failed", "OOM when allocating tensor with shape[1024,1024,64] and type float", "out of memory",
     "batch_size"),
    ("InternalError: failed", "E0000 cuda_driver.cc:1] failed to alloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
     "out of memory", "batch_size"),
    ("tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server", "",
     "port is already in use", "set another port in the job"),
    ("RuntimeError: server failed", 'E0000 server_chttp2.cc:40] {"description":"Address already in use"}',
     "port is already in use", "stop what holds it"),
    ("RuntimeError: x", "Failed to add port to server", "port", "another port"),
    # PyTorch's, as torch 2.14 prints them
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "", "out of memory", "batch_size"),
    ("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!", "", "nccl backend in a process "
     "without a GPU", 'else "gloo"'),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1971, unhandled system error", "",
     "NCCL failed", "NCCL_P2P_DISABLE"),
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.", "",
     "never joined the rendezvous", "reachable row"),
    ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
     "[10.213.0.3]:47845", "", "a peer process ended", "other nodes' logs"),
    # JAX's, as jax 0.10.2 prints them: its coordination service ends the process from C++ (no traceback)
    ("*** Check failure stack trace: ***", "F1128 18:54:17.963561   11068 client.h:80] Terminating process because "
     "the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the "
     "other task logs for more details. absl::Status: DEADLINE_EXCEEDED: Deadline Exceeded\n\nRPC: "
     "/xla.coordination.CoordinationService/RegisterTask", "never joined the coordinator", "reachable row"),
    ("*** Check failure stack trace: ***", "F1128 client.h:80] Terminating process because the JAX distributed "
     "service detected fatal errors. This most likely indicates that another task died; see the other task logs "
     "for more details.", "another JAX process ended", "other processes' logs"),
    ("jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
     "Connection closed by peer [10.213.0.3]:20193", "", "a peer process ended", "other nodes' logs"),
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.", "",
     "out of memory", "batch_size"),
])
def test_known_causes_name_their_fix(exception, context, cause, fix):
    found = known_cause(exception, context)
    assert found is not None and cause in found.cause and fix in found.fix, found
    assert found.words == f"{found.cause}; fix: {found.fix}" and "\n" not in found.words


@pytest.mark.parametrize("exception, context", [
    ("ValueError: the checkpoint has no weights", ""),
    ("ValueError: Attempt to convert a value (None) with an unsupported type (<class 'NoneType'>) to a Tensor.", ""),
    ("TypeError: PerReplica objects are not iterable", ""),  # PerReplica, but not the conversion
    ("ImportError: cannot import name 'foo' from 'bar'", ""),
    ("KeyError: 'No module named'", ""),
    ("", ""),
])
def test_other_errors_have_no_known_cause(exception, context):
    assert known_cause(exception, context) is None
