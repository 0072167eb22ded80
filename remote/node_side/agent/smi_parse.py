"""nvidia-smi's side of the stats agent: what is asked of it and how its CSV answers read.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``);
the controller imports it too, to read recorded nvidia-smi output. A field nvidia-smi should report
goes into ``GPU_QUERY`` (its name there, our key in the JSON line); ``gpu_smi.py`` runs the queries.
"""

from __future__ import annotations

import csv

if __package__:  # how the node_side modules import each other: see stats_agent.py's docstring
    from . import gpu_health
else:
    import gpu_health

SMI_FORMAT = "--format=csv,noheader,nounits"

# nvidia-smi field -> our key, in query order.
GPU_QUERY = (
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("utilization.gpu", "util"),
    ("memory.used", "mem_used"),
    ("memory.total", "mem_total"),
    ("temperature.gpu", "temp"),
    ("power.draw", "power"),
    ("power.limit", "power_limit"),
    ("clocks.sm", "sm_clock"),
    ("driver_version", "driver"),
)
# The health query (gpu_health.py), a one-shot run apart at a slower cadence: nvidia-smi's documented
# --help-query-gpu fields. Every figure is a number; the reasons are a hex bitmask ("0x...04").
HEALTH_QUERY = (
    ("uuid", "uuid"),
    ("pci.bus_id", "bus_id"),
    ("clocks_event_reasons.active", "throttle"),
    ("clocks.mem", "mem_clock"),
    ("clocks.max.sm", "sm_clock_max"),
    ("clocks.max.memory", "mem_clock_max"),
    ("pcie.link.gen.current", "gen"),
    ("pcie.link.width.current", "width"),
    ("pcie.link.gen.max", "max_gen"),
    ("pcie.link.width.max", "max_width"),
    ("pcie.link.gen.gpumax", "gpu_max_gen"),
)
# Drivers before the reasons' rename to "clocks_event_reasons" know them as "clocks_throttle_reasons",
# and may lack pcie.link.gen.gpumax: nvidia-smi refuses a whole query for one field it does not know.
HEALTH_QUERY_OLDER = tuple(
    ("clocks_throttle_reasons.active", key) if key == "throttle" else (field, key)
    for field, key in HEALTH_QUERY if key != "gpu_max_gen"
)
HEALTH_QUERIES = (HEALTH_QUERY, HEALTH_QUERY_OLDER)
APP_QUERY = (("gpu_uuid", "uuid"), ("pid", "pid"), ("process_name", "name"), ("used_memory", "mem"))
TEXT_KEYS = ("name", "uuid", "driver")


def query_arg(query, fields):
    """``--query-gpu=index,name,...``: the argument that asks nvidia-smi for ``fields``."""
    return query + ",".join(field for field, _ in fields)


# --- cell values ---------------------------------------------------------------------------------

def clean(cell):
    """Return a stripped nvidia-smi cell, or None where it says the value is not available.

    nvidia-smi writes every "no value" as a bracketed message ("[N/A]", "[Not Supported]",
    "[Requested functionality has been deprecated]", ...) and, for a few fields, bare "N/A" or an
    empty cell; all of them mean the same thing to us.
    """
    text = cell.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def number(cell):
    """Parse a cell as int or float; None when it is not available or not a finite number."""
    text = clean(cell) if isinstance(cell, str) else None
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


# --- nvidia-smi's output -------------------------------------------------------------------------

def _rows(csv_text, width, errors):
    """Yield the CSV rows that have ``width`` cells; report every other non-blank line."""
    for row in csv.reader(csv_text.splitlines()):
        if not row or not "".join(row).strip():
            continue
        if len(row) != width:
            if errors is not None:
                errors.append(f"nvidia-smi: unexpected line: {','.join(row)[:200]!r}")
            continue
        yield row


def _typed(row, query):
    return {
        key: (clean(cell) if key in TEXT_KEYS else number(cell))
        for (_, key), cell in zip(query, row)
    }


def parse_nvidia_smi_gpus(csv_text, errors=None):
    """Parse ``--query-gpu`` output (our GPU_QUERY order, csv,noheader,nounits) into GPU dicts.

    Each dict has the GPU keys of the JSON line plus ``driver`` (which the caller lifts to the
    node); lines of the wrong shape (e.g. "No devices were found") are skipped and, if ``errors``
    is a list, described there.
    """
    return [_typed(row, GPU_QUERY) for row in _rows(csv_text, len(GPU_QUERY), errors)]


def parse_nvidia_smi_apps(csv_text, errors=None):
    """Parse ``--query-compute-apps`` output (gpu_uuid,pid,process_name,used_memory) by GPU uuid."""
    apps = {}
    for row in _rows(csv_text, len(APP_QUERY), errors):
        app = _typed(row, APP_QUERY)
        apps.setdefault(app.pop("uuid"), []).append(app)
    return apps


def hex_mask(cell):
    """A bitmask cell such as ``0x0000000000000004`` as an int; None when not available or not hex."""
    text = clean(cell) if isinstance(cell, str) else None
    if text is None or not text.lower().startswith("0x"):
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def parse_nvidia_smi_health(csv_text, query=HEALTH_QUERY, errors=None, card_max_width=lambda bus_id: None):
    """Parse a health query's output (``query``: one of HEALTH_QUERIES) into health keys by GPU uuid.

    The keys are ``gpu_health.py``'s; ``card_max_width(bus_id)`` gives the card's own link width,
    which nvidia-smi does not report (``gpu_health.card_max_width`` on a node: sysfs).
    """
    return health_by_uuid(_rows(csv_text, len(query), errors), query, card_max_width)


def health_by_uuid(rows, query=HEALTH_QUERY, card_max_width=lambda bus_id: None):
    """Health keys by GPU uuid from a health query's rows (lists of cells), as parse_nvidia_smi_health."""
    found = {}
    for row in rows:
        cells = {key: cell for (_, key), cell in zip(query, row)}
        health = gpu_health.no_health()
        health["throttle"] = gpu_health.throttle_names(hex_mask(cells["throttle"]))
        health.update((key, number(cells[key])) for key in gpu_health.CLOCK_KEYS)
        health["pcie"].update((key, number(cells[key])) for key in gpu_health.PCIE_KEYS if key in cells)
        health["pcie"]["gpu_max_width"] = card_max_width(clean(cells["bus_id"]))
        health["bus_id"] = clean(cells["bus_id"])
        found[clean(cells["uuid"])] = health
    return found


def parse_nvidia_smi_version(text):
    """Return the CUDA version from ``nvidia-smi --version`` output, or None (older drivers)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "cuda version":
            return clean(value)
    return None


class LoopIterations:
    """Cut the output of ``nvidia-smi --query-gpu ... --loop-ms=N`` into one GPU list per iteration.

    ``fields`` is the query (GPU_QUERY, or a health query whose rows ``convert`` turns into what an
    iteration gives: by default each row as a dict of the query's keys).

    In loop mode nvidia-smi prints every GPU's row again each iteration with nothing in between, so
    where one iteration ends has to be inferred. Two rules do it: an iteration is complete as soon
    as it has as many rows as the previous complete one had (``expected``; no waiting for the next
    iteration in the steady state), and a row whose GPU (index, uuid) is already in the iteration
    starts the next one. The second rule copes with the GPU count changing: a GPU falling off the
    bus (fewer rows, the first GPU's row among them or not) or coming back (more rows) costs one
    iteration's delay, after which ``expected`` is the new count. Lines that are not GPU rows
    (warnings, "No devices were found") are reported and do not count. Before any count is known,
    the output going quiet after some rows ends the first iteration (``close``): nvidia-smi prints
    an iteration's rows together, iterations a loop period apart.
    """

    def __init__(self, expected=None, fields=GPU_QUERY, convert=None):
        self.expected = expected
        self.fields = fields
        self.convert = convert or (lambda rows: [_typed(row, fields) for row in rows])
        self.key_columns = tuple(i for i, (_, key) in enumerate(fields) if key in ("index", "uuid"))
        self.rows = []
        self.published = 0  # how many of ``rows`` were already returned as a complete iteration

    def feed(self, line, errors):
        """Take one line; return the GPU dicts of the iteration it completes, else None."""
        complete = None
        for row in _rows(line, len(self.fields), errors):
            complete = self._add(row) or complete
        return self.convert(complete) if complete else None

    def counting(self):
        """Rows of the first iteration are in and how many make one is not known yet."""
        return self.expected is None and bool(self.rows)

    def close(self):
        """The output went quiet after the pending rows: return them as a complete iteration."""
        self.expected = self.published = len(self.rows)
        return self.convert(self.rows)

    def _add(self, row):
        complete = None
        if self._key(row) in [self._key(seen) for seen in self.rows]:
            if len(self.rows) != self.published:  # it did not reach ``expected``: it is done now
                complete = self.rows
            self.expected = len(self.rows)
            self.rows, self.published = [], 0
        self.rows.append(row)
        if len(self.rows) == self.expected:
            complete, self.published = list(self.rows), len(self.rows)
        return complete

    def _key(self, row):
        """What tells one GPU's row from another's: its index and uuid, as far as the query has them."""
        return tuple(row[i].strip() for i in self.key_columns)
