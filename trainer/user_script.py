"""Start a user's training script as `python SCRIPT ARGS` would, with homegpu's settings for a run.

`python -m homegpu.trainer.user_script SCRIPT [ARGS...]`, with PYTHONPATH naming the folder that
holds homegpu/trainer (the synced `_homegpu/`). Before the script runs:
- in a multi-worker run, the two settings that let the built-in trainer ride out a Wi-Fi drop: gRPC's
  TCP_USER_TIMEOUT raised (link_patience.py) and, once the script imports TensorFlow, the coordination
  service's heartbeat timeout (coordination.py), both to $HOMEGPU_PEER_TIMEOUT (120 s);
- with HOMEGPU_KERAS=tf-keras (the job's `keras = "tf-keras"`), `import keras` gives tf-keras;
- in a JAX run, once the script imports JAX, homegpu as a cluster environment it detects (jax_cluster.py), so
  `jax.distributed.initialize()` needs no arguments;
- with the job's gpu_memory, the framework the script imports held to it (gpu_budget.py).
TensorFlow and JAX are not imported here, so whatever the script sets before importing it still counts.

The script sees what `python SCRIPT ARGS` gives it: `__name__ == "__main__"`, its `__file__`, `sys.argv`,
its own folder first on sys.path, the working dir, its exit status, and a traceback that starts in its
own code. Our folder leaves sys.path and PYTHONPATH again, so its imports and child processes see none of us.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from homegpu.trainer import gpu_budget, jax_cluster
from homegpu.trainer.cluster import ClusterConfigError, worker_role
from homegpu.trainer.coordination import peer_timeout, tolerate_quiet_peers
from homegpu.trainer.import_hooks import after_import
from homegpu.trainer.keras_alias import use_tf_keras_for_keras
from homegpu.trainer.link_patience import keep_links_through_drops

KERAS_ENV = "HOMEGPU_KERAS"  # "tf-keras": a script's `import keras` gets tf-keras
OUR_FOLDER = str(Path(__file__).resolve().parents[2])  # the folder that holds homegpu/trainer


def _patient_coordination() -> None:
    """The coordination service's heartbeat timeout, before the script builds its strategy."""
    try:
        tolerate_quiet_peers(peer_timeout())
    except Exception as exc:  # a private TensorFlow API: a change there must not stop the user's script
        print(f"homegpu: TensorFlow's peer timeout stays at its default ({type(exc).__name__}: {exc}); "
              "a network drop over 10 s will restart the run", file=sys.stderr, flush=True)


def prepare_for_run(env: os._Environ | dict = os.environ) -> None:
    """Everything homegpu sets up in this process before the script runs (see the module's docstring)."""
    if env.get(KERAS_ENV) == "tf-keras":
        use_tf_keras_for_keras()
    gpu_budget.hold_to_budget(env)
    if jax_cluster.in_run(env):
        after_import("jax", jax_cluster.register)
    try:
        multi_worker = worker_role(env).multi_worker
    except ClusterConfigError:
        multi_worker = False  # TensorFlow will say what is wrong with TF_CONFIG, in the script's own words
    if multi_worker:
        keep_links_through_drops(peer_timeout(env))
        after_import("tensorflow", _patient_coordination)


def _forget_our_folder() -> None:
    sys.path[:] = [entry for entry in sys.path if entry != OUR_FOLDER]
    rest = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != OUR_FOLDER]
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)


def run_script(script: str, args: list[str]) -> None:
    """Run `script` as __main__ with `args`; an exception it raises is printed from its own first frame
    on (as `python SCRIPT` prints it) and exits 1. SystemExit passes through with its status."""
    path = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
            tb = tb.tb_next  # this module's and runpy's frames
        if tb is not None:
            exc.__traceback__ = tb  # the default hook prints the exception's own traceback
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m homegpu.trainer.user_script SCRIPT [ARGS...]")
    _forget_our_folder()
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.getcwd():
        del sys.path[0]  # `-m` put the working dir first; `python SCRIPT` puts the script's folder there
    prepare_for_run()
    run_script(argv[0], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
