"""homegpu.remote.doctor: `homegpu doctor`: each node probed for what a job needs, the pure judgements of what was found,
and the rows (Check) with their fixes.
"""
