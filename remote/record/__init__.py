"""homegpu.remote.record: what a run leaves in experiments/RUN-ID/: logs and metrics, the timeline
(SQLite, one more subscriber of the hub), run.json and the self-contained HTML report.
"""

from __future__ import annotations

from homegpu.remote.record.energy import RunEnergy, energy_of
from homegpu.remote.record.experiment import ExperimentLog, find_stragglers
from homegpu.remote.record.recorder import RunRecord
from homegpu.remote.record.html_report import write_report
from homegpu.remote.record.html_report_inputs import ReportError, read_manifest
from homegpu.remote.record.live_runs import LiveRun, LiveRuns
from homegpu.remote.record.run_folder import RunFolder, timelines
from homegpu.remote.record.timeline import load_timeline
from homegpu.remote.record.timeline_schema import NodeTimeline, Timeline, TimelineDamaged, WorkerTimeline, read_meta

__all__ = [
    "ExperimentLog", "LiveRun", "LiveRuns", "NodeTimeline", "ReportError", "RunEnergy", "RunFolder", "RunRecord",
    "Timeline", "TimelineDamaged", "WorkerTimeline", "energy_of", "find_stragglers", "load_timeline", "read_manifest",
    "read_meta", "timelines", "write_report",
]
