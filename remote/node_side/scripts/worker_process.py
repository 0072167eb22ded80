"""Start, inspect and stop detached worker processes on a node (the process runtime's node side).

STDLIB ONLY, Python 3.8+: it is sent to nodes as `python3 -c <this file> COMMAND ...` and must not
import homegpu. All state lives in files under the run directory, so a restarted homegpu (or
another terminal) finds running workers again:

    RUN_DIR/LABEL.json   job, run id, index, generation, pid and the pid's start time
    RUN_DIR/LOG          the worker's stdout and stderr (--log; the orchestrator names one per generation)
    RUN_DIR/LABEL.exit   {"generation": G, "status": CODE, "nospace": B} once that generation has ended
                         (on a disk too full for it: an empty file named LABEL.exit.G.CODE.nospace)

Commands (each prints one JSON object):
    start  --run-dir D --label L --log NAME --meta JSON [--cwd DIR] [--mkdir DIR] [--env K=V ...]
           -- ARGV...
    status --run-dir D --label L [--label L2 ...]   ({"workers": [one status per label]})
    stop   --run-dir D --label L [--grace SECONDS]
    list   --root DIR            (every worker under DIR/*/, for `homegpu jobs` and reattaching)
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import time


# The log's last line, once the worker ended: the controller polls the node's workers when it reads it
EXIT_NOTE = "=== homegpu: %s generation %s exited with status %d ===\n"


def _paths(run_dir, label):
    base = os.path.join(os.path.expanduser(run_dir), label)
    return base + ".json", base + ".exit"


def _start_time(pid):
    """The kernel's start time of `pid` (clock ticks since boot): tells a reused pid from ours."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(meta):
    pid = meta.get("pid") if isinstance(meta, dict) else None
    if not isinstance(pid, int) or pid <= 1:  # a damaged file's: never signalled, never waited for
        return False
    return _start_time(pid) == meta.get("start_time") and not _is_zombie(pid)


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# What each state file holds, as start() and the waiter write it: key -> (allowed types, required).
_NONE = type(None)
_META_KEYS = {"pid": ((int,), True), "start_time": ((int, _NONE), True), "generation": ((int, _NONE), False),
              "label": ((str,), False), "job": ((str,), False), "run_id": ((str,), False), "waiter": ((dict,), False)}
_EXIT_KEYS = {"generation": ((int, _NONE), True), "status": ((int,), True)}


def _read_state(path, keys):
    """(data, problem): (None, None) when there is no file; (None, what is wrong) when it is there but
    is not what homegpu writes (truncated, not JSON, a key missing or of the wrong type). The label is
    the file's name: one inside it is only checked."""
    if not os.path.exists(path):
        return None, None
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None, "truncated or not JSON (%s)" % (exc,)
    if not isinstance(data, dict):
        return None, "not a JSON object"
    for key, (kinds, required) in keys.items():
        if key not in data:
            if required:
                return None, "no %s" % key
        elif not isinstance(data[key], kinds) or isinstance(data[key], bool):
            return None, "%s is %r" % (key, data[key])
    return data, None


def _damaged(path, problem):
    return {"state": "damaged", "file": path, "problem": problem}


def _write_json(path, data):
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):  # a full disk leaves no half-written file behind
            os.unlink(tmp)
        raise


def _full(exc):
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _note(fd, text):
    """Write the supervisor's own line to the log; False when the disk is full (it goes on regardless)."""
    try:
        os.write(fd, text.encode())
        return True
    except OSError as exc:
        return not _full(exc)


def _record_exit(exit_path, generation, code, nospace):
    """The exit file; on a disk too full for it, an empty file whose name holds the record."""
    try:
        _write_json(exit_path, {"generation": generation, "status": code, "nospace": nospace})
    except OSError as exc:
        if not _full(exc):
            raise
        os.close(os.open("%s.%s.%d.nospace" % (exit_path, generation, code), os.O_CREAT | os.O_WRONLY, 0o644))


def _exit_marker(exit_path, generation):
    """The record an empty LABEL.exit.G.CODE.nospace file holds for `generation`, or None."""
    folder, name = os.path.split(exit_path)
    prefix = "%s.%s." % (name, generation)
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        code = entry[len(prefix):-len(".nospace")]
        if entry.startswith(prefix) and entry.endswith(".nospace") and code.lstrip("-").isdigit():
            return {"generation": generation, "status": int(code), "nospace": True}
    return None


def _clear_exit(exit_path):
    folder, name = os.path.split(exit_path)
    for entry in os.listdir(folder):
        if entry == name or (entry.startswith(name + ".") and entry.endswith(".nospace")):
            os.unlink(os.path.join(folder, entry))


def start(args):
    meta_path, exit_path = _paths(args.run_dir, args.label)
    log_path = os.path.join(os.path.expanduser(args.run_dir), args.log)
    os.makedirs(os.path.dirname(meta_path), exist_ok=True)
    old, _ = _read_state(meta_path, _META_KEYS)  # a damaged one is replaced, as an ended worker's is
    if old and _alive(old):
        return {"error": "already running", "pid": old["pid"], "generation": old.get("generation")}
    _clear_exit(exit_path)
    if args.mkdir:
        os.makedirs(os.path.expanduser(args.mkdir), exist_ok=True)
    meta = json.loads(args.meta)
    env = dict(os.environ)
    env.update(item.split("=", 1) for item in args.env)
    read_end, write_end = os.pipe()
    waiter = os.fork()
    if waiter == 0:  # the waiter: detached from the SSH session, records the exit status
        os.close(read_end)
        os.setsid()
        _waiter(args, env, log_path, exit_path, meta, write_end)
    os.close(write_end)
    report = os.read(read_end, 4096).decode() or '{"error": "worker did not start"}'
    os.close(read_end)
    result = json.loads(report)
    if "pid" in result:
        meta.update(pid=result["pid"], start_time=_start_time(result["pid"]), label=args.label,
                    started=time.time(), argv=args.argv,
                    waiter={"pid": waiter, "start_time": _start_time(waiter)})
        try:
            _write_json(meta_path, meta)
        except OSError as exc:  # a worker nobody could find again must not run on
            _signal_group(result["pid"], signal.SIGKILL)
            return {"error": "cannot record the worker in %s: %s" % (meta_path, exc.strerror)}
    return result


def _waiter(args, env, log_path, exit_path, meta, report_fd):
    """Fork the worker in its own process group, tell the starter its pid, wait, record the exit."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # keep nothing of the SSH session open, or it could not close
        os.dup2(quiet, fd)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = _note(log, "=== homegpu: %s generation %s starting ===\n" % (args.label, meta.get("generation")))
    exec_check_r, exec_check_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(exec_check_r)
            os.set_inheritable(exec_check_w, False)  # closes on exec: EOF means exec worked
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            if args.cwd:
                os.chdir(os.path.expanduser(args.cwd))
            os.execvpe(args.argv[0], args.argv, env)
        except Exception as exc:  # noqa: BLE001 - reported to the starter, then this child ends
            os.write(exec_check_w, str(exc).encode())
        os._exit(127)
    os.close(exec_check_w)
    failure = os.read(exec_check_r, 4096).decode()
    report = {"error": "cannot start %s: %s" % (args.argv[0], failure)} if failure else {"pid": pid}
    os.write(report_fd, json.dumps(report).encode())
    os.close(report_fd)
    _, status = os.waitpid(pid, 0)
    code = _exit_code(status)
    written = _note(log, EXIT_NOTE % (args.label, meta.get("generation"), code)) and written
    _record_exit(exit_path, meta.get("generation"), code, nospace=not written)
    os._exit(0)


def _exit_code(status):
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def statuses(args):
    """The status of each --label, in order: one process for all of a node's workers."""
    return {"workers": [dict(worker_status(args.run_dir, label), label=label) for label in args.label]}


def worker_status(run_dir, label):
    """The worker's state; "damaged" (naming the file and what is wrong) when a state file that
    decides it is not what homegpu writes."""
    meta_path, exit_path = _paths(run_dir, label)
    meta, problem = _read_state(meta_path, _META_KEYS)
    if problem:
        return _damaged(meta_path, problem)
    if meta is None:
        return {"state": "missing"}
    if _alive(meta):
        return dict(meta, state="running")
    # the waiter looked at before its exit file is read: one that wrote its status and ended in between would
    # otherwise leave neither, and a worker that exited 0 would be called vanished
    waiting = _alive(meta.get("waiter") or {})
    ended, problem = _read_state(exit_path, _EXIT_KEYS)
    if ended is None and problem is None:  # a disk too full for the exit file: its record is in a file name
        ended = _exit_marker(exit_path, meta.get("generation"))
    if problem:
        return dict(meta, **_damaged(exit_path, problem))
    if ended is not None and ended.get("generation") == meta.get("generation"):
        return dict(meta, state="exited", status=ended["status"], nospace=ended.get("nospace", False))
    if waiting:
        return dict(meta, state="running")  # ended this instant: the waiter is writing its status
    return dict(meta, state="vanished")  # killed with its waiter, or the machine rebooted


def stop(args):
    meta_path, exit_path = _paths(args.run_dir, args.label)
    meta, _ = _read_state(meta_path, _META_KEYS)
    if meta is None or not _alive(meta):
        return worker_status(args.run_dir, args.label)
    pid = meta["pid"]
    _signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on TERM
    _signal_group(pid, signal.SIGTERM)
    deadline = time.time() + args.grace
    while time.time() < deadline and _alive(meta):
        time.sleep(0.1)
    if _alive(meta):
        _signal_group(pid, signal.SIGKILL)
        while _alive(meta) and time.time() < deadline + 5:
            time.sleep(0.05)
    for _ in range(50):  # let the waiter record the exit status
        if os.path.exists(exit_path):
            break
        time.sleep(0.05)
    return worker_status(args.run_dir, args.label)


def _signal_group(pid, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def list_workers(args):
    root = os.path.expanduser(args.root)
    workers = []
    for run_id in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        run_dir = os.path.join(root, run_id)
        for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
            if name.endswith(".json"):
                label = name[:-5]
                status = dict(worker_status(run_dir, label), label=label, run_dir=run_dir)
                status.setdefault("run_id", run_id)  # a damaged file's run is its directory's
                workers.append(status)
    return {"workers": workers}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="homegpu-worker")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "status", "stop"):
        sub = commands.add_parser(name)
        sub.add_argument("--run-dir", required=True)
        sub.add_argument("--label", required=True, action="append" if name == "status" else "store")
    commands.choices["start"].add_argument("--meta", default="{}")
    commands.choices["start"].add_argument("--log", required=True)
    commands.choices["start"].add_argument("--cwd", default="")
    commands.choices["start"].add_argument("--mkdir", default="", help="a directory the worker needs to exist")
    commands.choices["start"].add_argument("--env", action="append", default=[])
    commands.choices["start"].add_argument("argv", nargs=argparse.REMAINDER)
    commands.choices["stop"].add_argument("--grace", type=float, default=10.0)
    commands.add_parser("list").add_argument("--root", required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        args.argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not args.argv:
            parser.error("start needs a command after --")
    handler = {"start": start, "status": statuses, "stop": stop, "list": list_workers}[args.command]
    print(json.dumps(handler(args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
