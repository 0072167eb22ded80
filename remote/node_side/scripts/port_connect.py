"""Connect to other nodes' listeners and say whether each answered with its secret.

argv: SECONDS TARGETS_JSON ([{"host", "port", "secret"}]); one JSON line per target, any order.
"""

import errno, json, socket, sys, threading
timeout, targets = float(sys.argv[1]), json.loads(sys.argv[2])
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)
def read_line(conn):
    got = b""
    try:  # connected: whatever answers without our listener's secret is another program
        while not got.endswith(b"\n") and len(got) < 256:
            chunk = conn.recv(256)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    return got
def reach(target):
    out = {"host": target["host"], "port": target["port"], "status": "ok", "strerror": ""}
    try:
        with socket.create_connection((target["host"], target["port"]), timeout=timeout) as conn:
            if read_line(conn) != target["secret"].encode() + b"\n":
                out["status"] = "other"
    except socket.gaierror as exc:
        out.update(status="unresolved", strerror=exc.strerror or str(exc))
    except ConnectionRefusedError:
        out["status"] = "refused"
    except socket.timeout:
        out["status"] = "timed out"
    except OSError as exc:
        out.update(status="unreachable" if exc.errno in UNREACHABLE else "error", strerror=exc.strerror or str(exc))
    print(json.dumps(out), flush=True)
threads = [threading.Thread(target=reach, args=(t,)) for t in targets]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
