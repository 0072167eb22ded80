"""homegpu.remote.nodes: the cluster's live sessions: one per node over SSH (or local processes), host keys, the stats
agent's stream as snapshots, who owns each GPU process, and the hub every event goes through.
"""
