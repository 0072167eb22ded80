"""Listen once on the job's ports on every interface, answering each connection with a secret.

argv: SECRET SECONDS PORT...; one JSON line per port, then {"ready": true}; ends on stdin EOF or at
its deadline.
"""

import errno, json, os, select, socket, sys, time
secret, deadline = sys.argv[1].encode() + b"\n", time.time() + float(sys.argv[2])
def listen(port):
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError:
            pass
    return socket.create_server(("", port))
servers = []
for port in map(int, sys.argv[3:]):
    try:
        servers.append(listen(port))
        print(json.dumps({"port": port, "status": "listening"}))
    except OSError as exc:
        status = {errno.EADDRINUSE: "in use", errno.EACCES: "denied"}.get(exc.errno, "error")
        print(json.dumps({"host": "*", "port": port, "status": status, "strerror": exc.strerror or str(exc)}))
print(json.dumps({"ready": True}), flush=True)
while time.time() < deadline:
    readable = select.select(servers + [sys.stdin], [], [], max(0.0, deadline - time.time()))[0]
    if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):
        break
    for server in readable:
        if server is not sys.stdin:
            conn = server.accept()[0]
            with conn:
                conn.sendall(secret)
