"""homegpu.remote.net: the network between the nodes: the one TCP port probe, the proof that every node reaches every
worker's port, and iperf3 bandwidth with its all-reduce advice (the latest matrix kept per cluster).
"""
