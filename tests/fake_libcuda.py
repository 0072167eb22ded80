"""A fake ``libcuda.so.1`` for hardware these machines lack, built with gcc from the CUDA driver API's
documented signatures (cuda.h: ``CUresult`` an int, ``CUdevice`` an int, ``CUcontext`` a pointer,
``CUdeviceptr`` an unsigned 64-bit integer; ``CUDA_SUCCESS`` 0, ``CUDA_ERROR_NO_DEVICE`` 100).

It holds only what node_side/scripts/gpu_load.py calls. Each call checks what the driver would (cuInit first, a
context current in the calling thread, a copy between the buffers that thread allocated, sizes within
them) and answers like it; ``cuMemcpyHtoD_v2`` sleeps as long as the bytes take at the throughput it was
built with. At exit it says on stderr what was never released (contexts, allocations), so a test sees
a load that leaks. No GPU is touched: nothing here is a driver.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CUDA_ERROR_NO_DEVICE = 100
LEAK_NOTE = "fake libcuda: never released"  # the start of its exit note on stderr

SOURCE = r"""
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
       CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
       CUDA_ERROR_INVALID_CONTEXT = 201 };

static atomic_int initialised, contexts, allocations;
static int device_ids[DEVICES];
static __thread CUcontext current;                 /* the calling thread's context */
static __thread CUdeviceptr device_buffer;         /* what that thread allocated, to check copies */
static __thread size_t device_bytes, host_bytes;
static __thread void *host_buffer;

CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (INIT_RESULT == CUDA_SUCCESS) initialised = 1;
    return INIT_RESULT;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = DEVICES;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= DEVICES) return CUDA_ERROR_INVALID_DEVICE;
    current = *context = &device_ids[device];
    contexts++;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext context) {
    if (context == NULL || context != current) return CUDA_ERROR_INVALID_CONTEXT;
    current = NULL;
    contexts--;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((int *)current - device_ids == FULL_DEVICE) return CUDA_ERROR_OUT_OF_MEMORY;  /* a job holds it all */
    *pointer = device_buffer = 0x7f0000000000ULL + (CUdeviceptr)((int *)current - device_ids) * 0x100000000ULL;
    device_bytes = bytes;
    allocations++;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr pointer) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (pointer != device_buffer || !device_bytes) return CUDA_ERROR_INVALID_VALUE;
    device_bytes = 0;
    allocations--;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pointer, size_t bytes) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if ((*pointer = host_buffer = malloc(bytes)) == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    host_bytes = bytes;
    allocations++;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *pointer) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (pointer == NULL || pointer != host_buffer) return CUDA_ERROR_INVALID_VALUE;
    free(pointer);
    host_buffer = NULL;
    allocations--;
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr target, const void *source, size_t bytes) {
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (target != device_buffer || source != host_buffer || bytes > device_bytes || bytes > host_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    double seconds = (double)bytes / (GBPS * 1e9);   /* the link's throughput, as built */
    struct timespec wait = { (time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9) };
    nanosleep(&wait, NULL);
    return CUDA_SUCCESS;
}

__attribute__((destructor)) static void say_leaks(void) {
    if (contexts || allocations)
        fprintf(stderr, "fake libcuda: never released %d context(s), %d allocation(s)\n",
                (int)contexts, (int)allocations);
}
"""


def build_fake_libcuda(folder: Path, *, gbps: float = 24.0, devices: int = 1, init_result: int = 0,
                       full_device: int = -1) -> Path:
    """Compile the fake into ``folder/libcuda.so.1`` and return its path.

    Args:
        gbps: the host→device throughput its copies take (10^9 bytes a second).
        devices: how many GPUs it has.
        init_result: what cuInit answers (``CUDA_ERROR_NO_DEVICE`` for a driver without GPUs).
        full_device: the GPU whose memory is full (cuMemAlloc_v2 answers CUDA_ERROR_OUT_OF_MEMORY); -1: none.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed, and the fake libcuda is built with it: apt-get install -y gcc "
                    "(bash tests/run.sh installs it)", pytrace=False)
    folder.mkdir(parents=True, exist_ok=True)
    source, library = folder / "fake_libcuda.c", folder / "libcuda.so.1"
    source.write_text(SOURCE)
    defines = [f"-DGBPS={gbps!r}", f"-DDEVICES={devices}", f"-DINIT_RESULT={init_result}",
               f"-DFULL_DEVICE={full_device}"]
    built = subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *defines, "-o", str(library),
                            str(source)], capture_output=True, text=True, timeout=60)
    if built.returncode != 0:
        pytest.fail(f"gcc could not build the fake libcuda: {built.stderr.strip()}", pytrace=False)
    return library


@contextmanager
def libcuda_in(folder: Path, **options) -> Iterator[Path]:
    """For the block, ``folder/libcuda.so.1`` is the fake (``options`` as for :func:`build_fake_libcuda`);
    it and its source are removed after, so the folder is as it was (a node's LD_LIBRARY_PATH folder, say)."""
    library = build_fake_libcuda(folder, **options)
    try:
        yield library
    finally:
        library.unlink(missing_ok=True)
        (folder / "fake_libcuda.c").unlink(missing_ok=True)
