"""homegpu.remote.plan: pure planning before a run: each worker's devices (the device plan), who sets the pace (from GPU
models or the job's last run), worker slots and their TF_CONFIG.
"""
