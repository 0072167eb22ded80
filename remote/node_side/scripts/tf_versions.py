"""The installed TensorFlow and tf-keras versions of this python, as one JSON line.

The installed versions, not an import: importing TensorFlow costs seconds of CPU per node.
"""

import json
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
print(json.dumps({"tensorflow": version("tensorflow", "tensorflow-cpu"), "tf_keras": version("tf-keras")}))
