"""How much room the filesystem under each PATH has, and which filesystem that is.

argv: PATH...; one JSON line per path: {"path", "mount", "device", "fstype", "free_mb", "total_mb"}
(a path that does not exist yet is measured at its nearest existing parent). Used when a worker
failed, to tell a full disk from a script error.
"""

import json
import os
import sys


def mount_of(path):
    """(mount point, device, filesystem type) of the longest mount point that holds `path`."""
    best = ("/", "?", "?")
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                device, point, fstype = line.split()[:3]
                point = point.replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, device, fstype)
    except OSError:
        pass
    return best


for arg in sys.argv[1:]:
    path = os.path.realpath(os.path.expanduser(arg))
    while not os.path.exists(path) and path != "/":
        path = os.path.dirname(path)
    stat = os.statvfs(path)
    mount, device, fstype = mount_of(path)
    print(json.dumps({"path": arg, "mount": mount, "device": device, "fstype": fstype,
                      "free_mb": stat.f_bavail * stat.f_frsize // 2 ** 20,
                      "total_mb": stat.f_blocks * stat.f_frsize // 2 ** 20}))
