"""is_harmless_tf_notice and tf_log_severity on TensorFlow's recorded start-up output
(tests/fixtures/keras/README.md) and on lines in the formats TensorFlow prints."""

from __future__ import annotations

import pathlib

import pytest

from homegpu.remote.logs.console import ConsoleLines
from homegpu.remote.logs.tf_notices import is_harmless_tf_notice, tf_log_severity

KERAS = pathlib.Path(__file__).parent / "fixtures" / "keras"
RECORDINGS = sorted(KERAS.glob("*.txt"))
KNOWN_NOTICES = ("failed call to cuInit", "Could not find cuda drivers", "oneDNN custom operations",
                 "This TensorFlow binary is optimized", "To enable the following instructions",
                 "All log messages before absl::InitializeLog", "Memory patch applied")
MWMS_NOTICES = ("Input of GeneratorDatasetOp::Dataset will not be optimized",)


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda path: path.stem)
def test_recorded_start_up_notices_are_harmless_and_nothing_else_is(recording: pathlib.Path) -> None:
    console = ConsoleLines()
    lines = console.feed(recording.read_bytes()) + console.flush()
    harmless = [line for line in lines if is_harmless_tf_notice(line)]
    expected = KNOWN_NOTICES[:-1] + (KNOWN_NOTICES[-1:] + MWMS_NOTICES if "mwms" in recording.name else ())
    for known in expected:
        assert any(known in line for line in harmless), known
    for line in lines:
        if any(known in line for known in KNOWN_NOTICES + MWMS_NOTICES):
            assert is_harmless_tf_notice(line), line
        if line.startswith(("Epoch ", "keras from", "evaluate:", "script done", "40/40", "16/16")) \
                or "UserWarning" in line or "coordination" in line.lower():
            assert not is_harmless_tf_notice(line), line
    cuinit = next(line for line in lines if "cuInit" in line)
    assert "UNKNOWN ERROR (303)" in cuinit and tf_log_severity(cuinit) == "E"


@pytest.mark.parametrize("line, harmless, severity", [
    ("2024-03-01 10:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. "
     "You may see slightly different numerical results", True, "I"),
    ("2024-03-01 10:00:01.000001: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: "
     "Could not find TensorRT", True, "W"),
    ("2024-03-01 10:00:01.5: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to "
     "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been "
     "registered", True, "E"),
    ("2024-03-01 10:00:02.000000: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:274] failed "
     "call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected", True, "E"),
    ("2024-03-01 10:00:02.000001: I external/local_xla/xla/stream_executor/cuda/cuda_diagnostics.cc:129] "
     "retrieving CUDA diagnostic information for host: box", True, "I"),
    ("2024-03-01 10:00:02.000002: I external/local_xla/xla/stream_executor/cuda/cuda_diagnostics.cc:136] "
     "hostname: box", True, "I"),
    ("W0000 00:00:1795364710.000000     721 local_rendezvous.cc:405] Local rendezvous is aborting with "
     "status: OUT_OF_RANGE: End of sequence", True, "W"),
    ("E0000 00:00:1795364710.000000     721 collective_ops.cc:100] Collective ops is aborted by: failed "
     "to connect to all addresses", False, "E"),
    ("W0000 00:00:1795364710.000000     721 local_rendezvous.cc:405] Local rendezvous is aborting with "
     "status: CANCELLED", False, "W"),
    ("F0000 00:00:1795364710.000000     721 check.cc:1] Check failed: x", False, "F"),
    ("my script says: failed call to cuInit is fine", False, None),
    ("Traceback (most recent call last):", False, None),
])
def test_lines_in_tensorflow_formats(line: str, harmless: bool, severity: str | None) -> None:
    assert is_harmless_tf_notice(line) is harmless
    assert tf_log_severity(line) == severity
