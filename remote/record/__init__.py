"""homegpu.remote.record: what a run leaves in experiments/RUN-ID/: the logs and metrics, the timeline (SQLite), run.json
and the self-contained HTML report.
"""
