"""Why the Docker socket at argv[1] cannot be used: one word (ok, missing, denied, refused,
notsocket) or "other" and the error.
"""

import errno, os, socket, stat, sys
path = sys.argv[1]
try:
    if not stat.S_ISSOCK(os.stat(path).st_mode):
        sys.exit(print("notsocket"))
    socket.socket(socket.AF_UNIX).connect(path)
except OSError as e:
    print({errno.ENOENT: "missing", errno.ENOTDIR: "missing", errno.EACCES: "denied", errno.EPERM: "denied",
           errno.ECONNREFUSED: "refused"}.get(e.errno, "other " + str(e)))
else:
    print("ok")
