"""Put every GPU of this node under a short load of its own, so its PCIe link can be read at work.

An idle GPU drops its link to a lower PCIe generation to save power, so a link read idle says nothing
of what the card and slot can do. This copies host→device on every GPU at once, from pinned memory
through the CUDA driver API (``libcuda.so.1``, which every NVIDIA driver installs: no framework
needed), which trains each link up to its working generation, and measures what got through.

argv: ``[SECONDS [LIBRARY]]``. Stdout, one JSON object a line::

    {"loading": [0, 1]}           once the copies run on those GPUs: read their links now
    {"index": 0, "gbps": 24.1}    per GPU once the load has ended: host→device GB/s (10^9 bytes a second)
    {"index": 1, "error": "..."}  a GPU that could not be put under load
    {"error": "..."}              none could (the driver's library does not load, cuInit fails)

The load runs at least SECONDS (default 2), then until stdin ends (the controller has read the links,
or its channel closed), never longer than ``MAX_LOAD_S``: it always ends by itself. Devices are
numbered in PCI bus order with every GPU visible, as NVML and nvidia-smi number them, so index N here
is their GPU N. Standard library only, Python 3.8+, shipped to the node as source.
"""

import contextlib
import ctypes
import json
import os
import select
import sys
import threading
import time

LIBRARY = "libcuda.so.1"
CHUNK_BYTES = 64 << 20  # one copy: long enough that the call's own cost is noise
MIN_LOAD_S = 2.0
MAX_LOAD_S = 60.0  # past this the load ends though stdin stays open (the controller vanished)
START_TIMEOUT_S = 20.0  # a GPU whose first copy has not returned by then is reported, not waited for
STOP_TIMEOUT_S = 10.0  # the same for a copy that does not return once told to stop

_c = ctypes
# The driver API's documented signatures (cuda.h); CUdeviceptr is 64-bit on 64-bit hosts.
SIGNATURES = (
    ("cuInit", (_c.c_uint,)),
    ("cuDeviceGetCount", (_c.POINTER(_c.c_int),)),
    ("cuDeviceGet", (_c.POINTER(_c.c_int), _c.c_int)),
    ("cuCtxCreate_v2", (_c.POINTER(_c.c_void_p), _c.c_uint, _c.c_int)),
    ("cuCtxDestroy_v2", (_c.c_void_p,)),
    ("cuCtxSynchronize", ()),
    ("cuMemAlloc_v2", (_c.POINTER(_c.c_uint64), _c.c_size_t)),
    ("cuMemFree_v2", (_c.c_uint64,)),
    ("cuMemAllocHost_v2", (_c.POINTER(_c.c_void_p), _c.c_size_t)),
    ("cuMemFreeHost", (_c.c_void_p,)),
    ("cuMemcpyHtoD_v2", (_c.c_uint64, _c.c_void_p, _c.c_size_t)),
    ("cuGetErrorName", (_c.c_int, _c.POINTER(_c.c_char_p))),
)


class CudaError(Exception):
    """A driver call failed, or the driver is not there; the message says which and why."""


def open_driver(library=LIBRARY):
    """The CUDA driver library with the calls used here declared. Raises CudaError saying why not."""
    try:
        driver = ctypes.CDLL(library)
    except OSError as exc:
        why = str(exc)  # dlopen's message starts with the path it was given: said once is enough
        why = why[len(library) + 2:] if why.startswith(library + ": ") else why
        raise CudaError(f"{os.path.basename(library)} not loadable: {why}") from None
    for name, argtypes in SIGNATURES:
        function = getattr(driver, name, None)
        if function is None:
            raise CudaError(f"{library} has no {name}: not an NVIDIA driver's libcuda")
        function.restype, function.argtypes = ctypes.c_int, argtypes
    return driver


def check(driver, status, call):
    """Raise CudaError for a failed call, naming it and the driver's name for its status."""
    if status != 0:
        name = ctypes.c_char_p()
        known = driver.cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value
        raise CudaError(f"{call}: {name.value.decode() if known else 'CUDA error'} ({status})")


def device_count(driver):
    """cuInit, then how many GPUs CUDA sees. Raises CudaError, also when it sees none."""
    check(driver, driver.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check(driver, driver.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    if count.value < 1:
        raise CudaError("CUDA sees no GPU")
    return count.value


class GpuLoad(threading.Thread):
    """Copies host→device on one GPU until ``stop`` is set, in a context of its own."""

    def __init__(self, driver, index, stop):
        super().__init__(name=f"gpu-{index}", daemon=True)  # daemon: a hung copy cannot hold the exit
        self.driver, self.index, self.stop = driver, index, stop
        self.started = threading.Event()  # set once its copies run, or it failed before
        self.copied, self.seconds, self.error = 0, 0.0, ""

    def run(self):
        try:
            self._load()
        except CudaError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - said as this GPU's error, never a silent thread death
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started.set()

    def _load(self):
        driver, call = self.driver, self._call
        device, context = ctypes.c_int(), ctypes.c_void_p()
        target, source = ctypes.c_uint64(), ctypes.c_void_p()
        call(driver.cuDeviceGet(ctypes.byref(device), self.index), "cuDeviceGet")
        with contextlib.ExitStack() as undo:  # each release in reverse order, whatever fails
            call(driver.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate_v2")
            undo.callback(driver.cuCtxDestroy_v2, context)
            call(driver.cuMemAlloc_v2(ctypes.byref(target), CHUNK_BYTES), "cuMemAlloc_v2")
            undo.callback(driver.cuMemFree_v2, target)
            call(driver.cuMemAllocHost_v2(ctypes.byref(source), CHUNK_BYTES), "cuMemAllocHost_v2")
            undo.callback(driver.cuMemFreeHost, source)
            self._copy(target, source)

    def _copy(self, target, source):
        # From pinned memory the copy returns once done; the first wakes the link and is not counted.
        self._call(self.driver.cuMemcpyHtoD_v2(target, source, CHUNK_BYTES), "cuMemcpyHtoD_v2")
        self.started.set()
        began = time.monotonic()
        while not self.stop.is_set():
            self._call(self.driver.cuMemcpyHtoD_v2(target, source, CHUNK_BYTES), "cuMemcpyHtoD_v2")
            self.copied += CHUNK_BYTES
        self._call(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")
        self.seconds = time.monotonic() - began

    def _call(self, status, call):
        check(self.driver, status, call)

    def result(self):
        """Its line: GB/s host→device, or why there is none."""
        if self.is_alive():
            return {"index": self.index, "error": f"its copies did not return within {STOP_TIMEOUT_S:g} s"}
        if self.error:
            return {"index": self.index, "error": self.error}
        if not self.copied or self.seconds <= 0:
            return {"index": self.index, "error": "the load ended before a copy was timed"}
        return {"index": self.index, "gbps": round(self.copied / self.seconds / 1e9, 2)}


def wait_for_stdin_end(deadline):
    """Until stdin reaches EOF (whatever it says is read and ignored) or the monotonic deadline."""
    if sys.stdin is None:  # started with no stdin at all: nobody will read the links
        return
    fd = sys.stdin.fileno()
    while time.monotonic() < deadline:
        ready = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]
        if ready and not os.read(fd, 4096):
            return


def say(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run(seconds=MIN_LOAD_S, library=LIBRARY):
    """Load every GPU, say which run, hold the load as the module docstring says, then say what each
    measured. Returns whether every copy returned (a hung one leaves its thread behind)."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # read by cuInit: NVML's and nvidia-smi's order
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        driver = open_driver(library)
        count = device_count(driver)
    except CudaError as exc:
        say({"error": str(exc)})
        return True
    stop = threading.Event()
    loads = start_loads(driver, count, stop)
    late = {load.index for load in loads if not load.started.is_set()}
    running = [load.index for load in loads if load.index not in late and not load.error]
    say({"loading": running})
    if running:
        began = time.monotonic()
        wait_for_stdin_end(began + MAX_LOAD_S)
        time.sleep(max(0.0, began + seconds - time.monotonic()))
    stop.set()
    ending = time.monotonic() + STOP_TIMEOUT_S
    for load in loads:
        load.join(max(0.0, ending - time.monotonic()))
    for load in loads:
        say({"index": load.index, "error": f"its first copy did not return within {START_TIMEOUT_S:g} s"}
            if load.index in late else load.result())
    return not any(load.is_alive() for load in loads)


def start_loads(driver, count, stop):
    """A running GpuLoad per GPU, once each has its copies going or failed (``START_TIMEOUT_S`` at most)."""
    loads = [GpuLoad(driver, index, stop) for index in range(count)]
    for load in loads:
        load.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    for load in loads:
        load.started.wait(max(0.0, deadline - time.monotonic()))
    return loads


def main(argv):
    seconds = float(argv[0]) if argv else MIN_LOAD_S
    if not run(seconds, argv[1] if len(argv) > 1 else LIBRARY):
        os._exit(0)  # a copy still hangs in the driver: leave without waiting for its thread


if __name__ == "__main__":
    main(sys.argv[1:])
