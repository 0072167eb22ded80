"""Bind TCP ports on this node as TensorFlow's server (or iperf3) would, and say how each went.

argv: ADDRESS any|only PORT...; prints one JSON object per bind. With `any`, a port free on ADDRESS
is also bound on every interface of its family (TensorFlow's server binds them all).
"""

import errno, json, socket, sys
CODES = {errno.EADDRINUSE: "in use", errno.EADDRNOTAVAIL: "not local", errno.EACCES: "denied"}
def bind(host, port, family=0):
    out = {"host": host or "*", "port": port, "status": "error", "ip": "", "error": "", "strerror": ""}
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, family, socket.SOCK_STREAM, 0,
                                                          socket.AI_PASSIVE)[0]
        out["ip"] = addr[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            out.update(status="free", port=sock.getsockname()[1])
        finally:
            sock.close()
    except socket.gaierror as exc:
        out.update(status="unresolved", error=str(exc), strerror=exc.strerror or str(exc))
    except OSError as exc:
        out.update(status=CODES.get(exc.errno, "error"), error=str(exc), strerror=exc.strerror or str(exc))
    return out, family
address, every = sys.argv[1], sys.argv[2] == "any"
for port in sys.argv[3:]:
    out, family = bind(address, int(port))
    print(json.dumps(out))
    if every and out["status"] == "free":
        print(json.dumps(bind("", int(port), family)[0]))
