"""homegpu.remote.runtimes: how a worker runs on a node: the runtime contract, detached processes (setsid) and Docker
containers over the node's forwarded socket, and the one factory that picks between them.
"""
