"""The node side of jobs/lock.py: read, take, refresh or drop one job's lock file.

STDLIB ONLY, Python 3.8+: it is sent to the chief's node as `python -I -S -c <this file> COMMAND
JSON` and prints one JSON object. Every command runs under flock() on LOCK_DIR/.mutex, so reading
the lock, judging it and replacing it is one atomic step among all controllers; the kernel drops
that flock when a process dies, so a killed command never leaves it held. The lock file itself is
only ever replaced by rename() (readers see the old owner or the new, never none), and removed by
its owner alone.

    LOCK_DIR/JOB.lock  {"run_id", "host", "machine", "pid", "start_time", "acquired", "heartbeat"}

Times are this node's clock (`age` is measured here), so the controllers' clocks do not matter.
A lock is stale when its owner ran on this machine and its pid is gone (its heartbeat does not
matter then), or, taken from another machine, when its heartbeat is older than stale_after seconds.
A controller asking for the lock with the run id the lock holds gets it: it took that run over (serve
resuming its queue's run after a restart), so the run keeps its lock and releases it when it ends.
"""

import fcntl
import json
import os
import socket
import sys
import time


def machine_id():
    try:
        with open("/etc/machine-id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def pid_alive(pid, start_time):
    """Whether `pid` runs and is the process that took the lock (its kernel start time matches)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except (PermissionError, TypeError, ValueError, OverflowError):
            return isinstance(pid, int)
        return True
    if fields[0] == "Z":
        return False
    return start_time is None or int(fields[19]) == start_time


def read(path):
    try:
        with open(path) as handle:
            owner = json.load(handle)
        return owner if isinstance(owner, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as a lock of no one, hence stale


def write(path, owner):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump(owner, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def same_owner(current, me):
    return all(current.get(key) == me.get(key) for key in ("run_id", "host", "machine", "pid"))


def same_run(current, me):
    # a controller that took over the run itself (serve resuming its queue's run after a restart)
    return bool(me.get("run_id")) and current.get("run_id") == me.get("run_id")


def stale(current, now, stale_after):
    if current.get("host") == socket.gethostname() and current.get("machine", "") == machine_id():
        return not pid_alive(current.get("pid"), current.get("start_time"))
    heartbeat = current.get("heartbeat")
    return not isinstance(heartbeat, (int, float)) or now - heartbeat > stale_after


def described(current, now):
    if current is None:
        return None
    heartbeat = current.get("heartbeat")
    age = round(now - heartbeat, 3) if isinstance(heartbeat, (int, float)) else None
    return dict(current, age=age)


def command(name, args, path, now):
    current = read(path)
    me = dict(args.get("owner") or {}, heartbeat=now)
    if name == "peek":
        return {"holder": described(current, now)}
    if name == "acquire":
        if current is None or same_owner(current, me) or same_run(current, me):
            write(path, dict(me, acquired=(current or {}).get("acquired", now)))
            return {"acquired": True}
        if stale(current, now, args["stale_after"]):
            write(path, dict(me, acquired=now))
            return {"acquired": True, "took_over": described(current, now)}
        return {"acquired": False, "holder": described(current, now)}
    if current is None or not same_owner(current, me):
        return {"held": False, "holder": described(current, now)}
    if name == "refresh":
        write(path, dict(current, heartbeat=now))
    else:  # release
        os.remove(path)
    return {"held": True}


def main(argv):
    name, args = argv[0], json.loads(argv[1])
    lock_dir = os.path.expanduser(args["dir"])
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, ".mutex"), "a") as mutex:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        reply = command(name, args, os.path.join(lock_dir, args["job"] + ".lock"), time.time())
    print(json.dumps(reply))


if __name__ == "__main__":
    main(sys.argv[1:])
