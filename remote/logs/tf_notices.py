"""TensorFlow's known harmless start-up notices, so front ends can show them dim, not as errors.

On a node without a GPU, TensorFlow prints at start-up, among others (recorded in
tests/fixtures/keras/):

    E0000 00:00:1795364708.749516     721 cuda_platform.cc:52] failed call to cuInit: INTERNAL:
        CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)

An `E` (error) line that only says there is no GPU. `is_harmless_tf_notice` recognises these known
notices by their text; `tf_log_severity` reads the severity letter of any TensorFlow C++ log line.
Both take one completed console line (console.ConsoleLines) and are pure.

Usage:
    for line in lines:
        style = "dim" if is_harmless_tf_notice(line) else STYLES.get(tf_log_severity(line), "")
"""

from __future__ import annotations

import re

# glog's prefix (TF 2.17+: "E0000 00:00:1795364708.749516     721 file.cc:52] ") or TensorFlow's
# older one ("2024-03-01 10:00:00.123456: E external/.../file.cc:52] ").
_PREFIX = re.compile(r"^(?:(?P<glog>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
                     r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<old>[IWEF]) )"
                     r"(?P<source>[\w./-]+):\d+\] (?P<message>.*)$")

# Messages after the prefix: TensorFlow's notices on nodes without a GPU, about its build, about
# tf.data's internals (MultiWorkerMirroredStrategy's dataset distribution prints the
# GeneratorDatasetOp one for any dataset), and the end of a finite dataset.
_HARMLESS_MESSAGES = re.compile("|".join([
    r"failed call to cuInit",  # no GPU (UNKNOWN ERROR (303), CUDA_ERROR_NO_DEVICE ...)
    r"Could not find cuda drivers on your machine, GPU will not be used",
    r"oneDNN custom operations are on",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"TF-TRT Warning: Could not find TensorRT",
    r"Unable to register (?:cuDNN|cuFFT|cuBLAS) factory",
    r"computation placer already registered",
    r"kernel driver does not appear to be running on this host",
    r"retrieving CUDA diagnostic information for host",
    r"Memory patch applied: M_TRIM_THRESHOLD",
    r"Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not "
    r"implement the AsGraphDefInternal\(\) method",
    r"Local rendezvous is aborting with status: OUT_OF_RANGE: End of sequence",
]))
_HARMLESS_SOURCES = ("cuda_diagnostics.cc",)  # the details after a failed cuInit

# Lines TensorFlow prints without a prefix.
_HARMLESS_LINES = re.compile(
    r"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|To enable the following instructions: [\w ,]+, in other operations, rebuild TensorFlow "
    r"with the appropriate compiler flags\.)$")


def is_harmless_tf_notice(line: str) -> bool:
    """True when `line` is one of TensorFlow's known harmless notices (see the module docstring)."""
    text = line.strip()
    logged = _PREFIX.match(text)
    if logged is None:
        return _HARMLESS_LINES.match(text) is not None
    if logged.group("source").rsplit("/", 1)[-1] in _HARMLESS_SOURCES:
        return True
    return _HARMLESS_MESSAGES.search(logged.group("message")) is not None


def tf_log_severity(line: str) -> str | None:
    """"I", "W", "E" or "F" for a TensorFlow C++ log line (info, warning, error, fatal), else None."""
    logged = _PREFIX.match(line.strip())
    return None if logged is None else logged.group("glog") or logged.group("old")
