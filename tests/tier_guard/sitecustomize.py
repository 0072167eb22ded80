"""Loaded by every Python the tests start here (tests/tiers.py puts this folder on PYTHONPATH).

Where HOMEGPU_TEST_TF_NOTES names a folder (a test not marked `tensorflow` is running), an import of
TensorFlow writes a note there, its command line, for the test's teardown to find. It imports nothing.
"""

import os
import sys

_NOTES = os.environ.get("HOMEGPU_TEST_TF_NOTES")


class _TensorFlowNote:
    def find_spec(self, name, path=None, target=None):
        if name in ("tensorflow", "tf_keras") and not _only_looked_up():
            sys.meta_path.remove(self)  # once is enough
            try:
                with open(os.path.join(_NOTES, str(os.getpid())), "w") as note:
                    note.write(" ".join(sys.argv)[:300])
            except OSError:
                pass  # the test ended and its folder went: nothing to tell
        return None


def _only_looked_up():
    """Whether importlib.util.find_spec asks (torch._dynamo looks TensorFlow up without importing it)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "find_spec" and frame.f_code.co_filename.endswith("importlib.util>"):
            return True
        frame = frame.f_back
    return False


if _NOTES:
    sys.meta_path.insert(0, _TensorFlowNote())
