"""homegpu.remote.record: what a run leaves in experiments/RUN-ID/: logs and metrics, the timeline
(SQLite, one more subscriber of the hub), run.json and the self-contained HTML report.
"""

from __future__ import annotations

from homegpu.remote.record.energy import COUNTER, JOULES_PER_KWH, EnergySteps, RunEnergy, Step, energy_of
from homegpu.remote.record.downsample import bucket_index, bucket_time, bucket_time_sql
from homegpu.remote.record.experiment import ExperimentLog, find_stragglers
from homegpu.remote.record.recorder import RunRecord
from homegpu.remote.record.html_report import write_report
from homegpu.remote.record.html_report_inputs import ReportError
from homegpu.remote.record.run_folder import RunFolder, timelines
from homegpu.remote.record.sqlite_file import (
    check_store, create_atomically, errors_as_damage, open_for_writing, room_left, transaction,
)
from homegpu.remote.record.timeline import load_timeline
from homegpu.remote.record.write_trouble import Say, WriteTrouble, say_on_stderr
from homegpu.remote.record.timeline_schema import NodeTimeline, Timeline, TimelineDamaged, WorkerTimeline, read_meta

__all__ = [
    "COUNTER", "JOULES_PER_KWH", "EnergySteps", "RunEnergy", "Step", "energy_of", "ExperimentLog", "NodeTimeline", "ReportError", "RunFolder", "RunRecord", "Timeline", "TimelineDamaged",
    "WorkerTimeline", "bucket_index", "bucket_time", "bucket_time_sql", "find_stragglers", "load_timeline",
    "check_store", "create_atomically", "errors_as_damage", "open_for_writing", "read_meta", "room_left", "Say", "say_on_stderr", "timelines", "WriteTrouble", "transaction", "write_report",
]
