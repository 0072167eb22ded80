"""homegpu.remote.node_side.agent: the stats agent, the one long-running script on a node, and its modules.

``stats_agent.py`` streams one JSON line per interval about the node's GPUs, CPU, memory and disk for as
long as its SSH session lasts; what it measures is in modules of its own, listed in its ``MODULES`` in the
order they are shipped (``agent_common``, ``children``, ``gpu_health``, ``smi_parse``, ``gpu_smi``,
``gpu_nvml``, ``gpu_xid``, ``host_proc``, ``host_power``, ``process_owners``, ``sleep_watch``).

The rules, for every module here:

- standard library only, Python 3.8 or newer (``tests/test_node_side.py`` checks with vermin), and
  nothing from homegpu: a node needs no homegpu install. ``pynvml`` is the one exception, optional, and
  shipped by the controller with the agent;
- shipped together over one SSH session by ``nodes/agent_bundle.py``, never written on the node: its
  bootstrap makes a module of each of ``MODULES`` and puts it in ``sys.modules`` under its plain name, so
  each must come after those it imports and may import only the standard library and its siblings here,
  never a one-shot script of ``scripts/``;
- siblings are imported relatively on the controller and by plain name on a node (``stats_agent.py``'s
  docstring shows the two-branch import), so the folder also runs as is: ``python3 stats_agent.py``.

The controller imports a few of their names through ``homegpu.remote.node_side`` (the protocol version,
``gpu_health.THROTTLE_REASONS``, ``process_owners``' worker markers), so both sides read one definition.
"""
