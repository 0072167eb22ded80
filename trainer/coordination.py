"""How long TensorFlow waits for a quiet peer before it ends the run: long enough for a Wi-Fi drop.

MultiWorkerMirroredStrategy starts TensorFlow's coordination service with its defaults, under which
a worker that sends no heartbeat for 10 seconds counts as dead and every collective is aborted
("The following tasks are unhealthy (stopped sending heartbeats)"). On a home network a laptop's
Wi-Fi drops for 20-30 s and comes back with its TCP connections intact, so that default turns a
hiccup into a restart. homegpu watches the worker processes itself (exit statuses, stalls), so a
longer wait here loses nothing: a worker that really died is seen by homegpu at once. gRPC's own
20 s limit on the connections is the other half (link_patience.py).
"""

from __future__ import annotations

import os

DEFAULT_PEER_TIMEOUT = 120.0  # seconds; $HOMEGPU_PEER_TIMEOUT overrides it


def peer_timeout(env: os._Environ | dict = os.environ) -> float:
    """Seconds a peer may go quiet, from $HOMEGPU_PEER_TIMEOUT (default 120). Raises ValueError."""
    value = float(env.get("HOMEGPU_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT))
    if not 10 <= value <= 86_400:
        raise ValueError(f"HOMEGPU_PEER_TIMEOUT={value:g} is out of range: use 10 to 86400 seconds")
    return value


def tolerate_quiet_peers(seconds: float) -> None:
    """Configure the coordination service as MultiWorkerMirroredStrategy would, with a heartbeat
    timeout of `seconds`. Call it before the strategy is built (which then keeps this config)."""
    # Imported here: a user's script is started before TensorFlow is imported (user_script.py).
    # Private API (TF 2.21): the strategy calls the same method with the same leader and jobs.
    import tensorflow as tf
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    jobs = [coordination_config_pb2.CoordinatedJob(name=name, num_tasks=cluster.num_tasks(name))
            for name in ("chief", "worker") if name in cluster.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(seconds * 1000))
