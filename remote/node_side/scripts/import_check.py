"""Whether this python imports a framework, remembered: the import runs again only when what is installed changed.

Importing TensorFlow or PyTorch costs seconds of CPU, on every node at every run's preflight; reading which
distributions are installed (name, version, where) costs milliseconds. After an import that worked, this python
and those distributions are kept in STATE (0600) with the check's last line; the same fingerprint later answers
at once with that line. A distribution upgraded, reinstalled, removed or moved, or another python, means the
import runs again.

argv: STATE CHECK DIST[,ALTERNATIVE]...   CHECK: Python source run by this python (its last line is the answer).
Prints that line and exits 0, or prints the import's error on stderr and exits 1.
"""

import json, os, subprocess, sys
from importlib import metadata
def installed(alternatives):
    for name in alternatives.split(","):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        where = str(getattr(dist, "_path", ""))  # the .dist-info folder: a reinstall makes it anew
        try:
            stamp = os.stat(where).st_mtime_ns if where else 0
        except OSError:
            stamp = 0
        return [name, dist.version, where, stamp]
    return None
def load(path):
    try:
        with open(path) as f:
            known = json.load(f)
        return known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        return {}
def save(path, known):
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        part = "%s.%d" % (path, os.getpid())
        with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(known, f)
        os.replace(part, path)
    except OSError:
        pass  # not remembered: the next preflight imports again, which is only slower
state, check, dists = sys.argv[1], sys.argv[2], sys.argv[3:]
packages = [installed(alternatives) for alternatives in dists]
fingerprint = [sys.executable, sys.prefix, sys.version, packages]
key = sys.executable + "\0" + check
known = load(state)
if None not in packages and isinstance(known.get(key), dict) and known[key].get("fingerprint") == fingerprint:
    print(known[key].get("said", ""))
    sys.exit(0)
result = subprocess.run([sys.executable, "-c", check], stdout=subprocess.PIPE, universal_newlines=True)
if result.returncode != 0:
    sys.exit(1)  # the import's error went to stderr, as it would have without this script
said = (result.stdout.strip().splitlines() or [""])[-1]
if None not in packages:
    known[key] = {"fingerprint": fingerprint, "said": said}
    save(state, known)
print(said)
