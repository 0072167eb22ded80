"""The metric line protocol (see PROTOCOL.md): one JSON object per stdout line, behind a prefix.

Standard library only: the controller imports `parse_metric_line` from here, and user scripts may
copy `format_metric`. No TensorFlow import may ever be added to this module.
"""

from __future__ import annotations

import json
import math
from typing import Any

PREFIX = "HOMEGPU_METRIC "
EVENTS = ("start", "step", "epoch", "end", "error")


def format_metric(**fields: Any) -> str:
    """One metric line (no newline): the prefix, then the fields as compact JSON, `event` first.

    Numbers that JSON cannot carry (NaN, inf: a diverged loss) become null; numpy scalars
    (anything with `.item()`) become plain numbers.

    Raises:
        ValueError: `event` is missing or not a non-empty string.
        TypeError: a value is not JSON-serialisable.
    """
    event = fields.get("event")
    if not isinstance(event, str) or not event:
        raise ValueError("a metric needs an event name, e.g. event='epoch'")
    ordered = {"event": event, **{k: _plain(v) for k, v in fields.items() if k != "event"}}
    return PREFIX + json.dumps(ordered, separators=(",", ":"), allow_nan=False)


def parse_metric_line(line: str) -> dict | None:
    """The metric object on `line`, or None when it is not a well-formed metric line.

    The prefix must start the line, after optional whitespace or after the last carriage return
    (a progress bar may share the terminal line). The rest must be exactly one JSON object with a
    string `event`. Anything else, including log text that merely mentions the prefix, is None.
    """
    if not isinstance(line, str):
        return None
    text = line.rsplit("\r", 1)[-1].strip()
    if not text.startswith(PREFIX):
        return None
    try:
        data = json.loads(text[len(PREFIX):])
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str) or not data["event"]:
        return None
    return data


def _plain(value: Any) -> Any:
    """JSON-ready copy of `value`: numpy scalars unwrapped, non-finite floats as None."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
