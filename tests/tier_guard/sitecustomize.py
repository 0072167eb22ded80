"""Loaded by every Python the tests start here (tests/tiers.py puts this folder on PYTHONPATH).

Where HOMEGPU_TEST_TF_NOTES names a folder (a test not marked `tensorflow` is running), an import of
TensorFlow writes a note there, its command line, for the test's teardown to find. It imports nothing.
"""

import os
import sys

_NOTES = os.environ.get("HOMEGPU_TEST_TF_NOTES")


class _TensorFlowNote:
    def find_spec(self, name, path=None, target=None):
        if name in ("tensorflow", "tf_keras"):
            sys.meta_path.remove(self)  # once is enough
            try:
                with open(os.path.join(_NOTES, str(os.getpid())), "w") as note:
                    note.write(" ".join(sys.argv)[:300])
            except OSError:
                pass  # the test ended and its folder went: nothing to tell
        return None


if _NOTES:
    sys.meta_path.insert(0, _TensorFlowNote())
