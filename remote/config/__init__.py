"""homegpu.remote.config: cluster.toml read, validated and turned into frozen specs, and written back.

ClusterSpec holds [cluster], every [[nodes]] (NodeSpec), [jobs.NAME] (JobSpec) and [alerts] (AlertRules).
"""
