"""homegpu.remote.jobs: a run's life across its nodes: preflight, code sync, launch-or-attach under the job's lock, the
watch loop with restarts, the workers' logs, script errors told from faults, and the outputs home.
"""
