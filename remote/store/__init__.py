"""homegpu.remote.store: what homegpu's own SQLite stores share (the run's timeline, serve's history and queue):
made atomically, one transaction at a time, the one time-bucket rule, a failing write said once (`Say`), and the
one recorder of hub samples (`SampleRecorder`).
"""

from __future__ import annotations

from homegpu.remote.store.buckets import bucket_index, bucket_time, bucket_time_sql
from homegpu.remote.store.recorder import FLUSH_SECONDS, WAKE_SECONDS, SampleRecorder
from homegpu.remote.store.sqlite_file import (
    check_store, create_atomically, errors_as_damage, open_for_writing, room_left, transaction,
)
from homegpu.remote.store.write_trouble import Say, WriteTrouble, say_on_stderr

__all__ = [
    "FLUSH_SECONDS", "SampleRecorder", "Say", "WAKE_SECONDS", "WriteTrouble", "bucket_index", "bucket_time", "bucket_time_sql", "check_store", "create_atomically",
    "errors_as_damage", "open_for_writing", "room_left", "say_on_stderr", "transaction",
]
