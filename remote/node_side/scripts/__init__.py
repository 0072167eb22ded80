"""homegpu.remote.node_side.scripts: the one-shot scripts the controller runs on a node, each a file on its own.

Each does one thing and exits: a worker started, inspected or stopped (``worker_process``), code sync's node
half (``tree_sync``), the run lock's file (``job_lock``), a link of an image copy chain (``image_relay``),
doctor's and preflight's probes (``port_bind``, ``port_listen``, ``port_connect``, ``tf_versions``,
``import_check``, ``clock_echo``, ``docker_socket``, ``gpu_load``, ``disk_space``) and Wake-on-LAN's packet
(``wake_packet``).

The rules, for every script here:

- standard library only, Python 3.8 or newer (``tests/test_node_side.py`` checks with vermin), and nothing
  from homegpu: a node needs no homegpu install;
- shipped alone, as source: the controller reads it with ``homegpu.remote.node_side.script(NAME)`` and runs
  ``PYTHON -c SOURCE ARG...`` on the node, so a script imports no other file of node_side (there is none
  beside it on the node) and writes nothing there but what it is for;
- the controller may import one for a function both sides must share (``tree_sync.scan`` lists its own
  tree as the node lists its, ``wake_packet.send`` sends from the controller), through
  ``homegpu.remote.node_side``.
"""
