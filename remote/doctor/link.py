"""The doctor's "pcie link" row: each GPU's PCIe link read under a load of the doctor's own. Pure.

An idle GPU drops its link generation to save power, so a link read idle is never judged. The probe
(remote/doctor/probe.py) has node_side/scripts/gpu_load.py copy host→GPU on every GPU, reads them meanwhile
with the stats agent, and keeps what both said (:class:`LoadFacts`); the link is judged with the words
`status` uses (remote/nodes/health.py's ``link_causes``), followed by the throughput the copies got.
Where the load could not run (no libcuda, cuInit failing) the row says so and judges nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from homegpu.remote.doctor.check import Check
from homegpu.remote.events import GpuStats, NodeStats
from homegpu.remote.nodes import CommandResult, link_causes, link_text

NAME = "pcie link"
NOT_JUDGED = "an idle link is not judged"


@dataclass(frozen=True)
class LoadFacts:
    """What the load probe learned on one node.

    said: the load's JSON lines (node_side/scripts/gpu_load.py's docstring has their shape).
    reading: the stats agent's answer taken while the load ran; None when no GPU came under load.
    failure: why the load could not run where it ended without a word of its own ("" otherwise).
    """

    said: tuple[dict, ...] = ()
    reading: CommandResult | None = None
    failure: str = ""

    @property
    def problem(self) -> str:
        """Why no GPU was put under load at all ("" when some were)."""
        for said in self.said:
            if said.get("error") and "index" not in said:
                return str(said["error"])
        if self.failure:
            return self.failure
        if not any("index" in said for said in self.said):
            return "the load said nothing"
        return ""


def link_check(node: str, gpu_count: int, load: LoadFacts | None, reading: NodeStats | str | None,
               python_ok: bool = True) -> Check:
    """The row for one node: ✗ with the fix where a GPU's link runs below what card and slot can do
    under load, ✓ where every loaded GPU's runs at it, "-" where nothing could be judged.

    Args:
        gpu_count: the GPUs the stats agent saw (0: a CPU-only node, nothing to load).
        load: the probe's facts; None when it was not run.
        reading: ``load.reading`` as stats, or why the agent gave none (None: no reading).
    """
    if not python_ok:
        return Check(node, NAME, None, "skipped: needs a working python3")
    if gpu_count == 0:
        return Check(node, NAME, None, "not needed (no GPU)")
    problem = "the load was not run" if load is None else load.problem
    if problem:
        return Check(node, NAME, None, f"could not put the GPUs under load ({problem}); {NOT_JUDGED}")
    if not isinstance(reading, NodeStats):
        why = reading or "no answer"
        return Check(node, NAME, None, f"could not read the links under load (the stats agent: {why}); {NOT_JUDGED}")
    gpus = {gpu.index: gpu for gpu in reading.gpus}
    verdicts = [_gpu_verdict(said, gpus.get(said["index"])) for said in load.said if "index" in said]
    return _row(node, verdicts)


def _gpu_verdict(said: dict, gpu: GpuStats | None) -> tuple[bool | None, str, list[str]]:
    """(ok, what to say, fixes) for one GPU's load line and its reading under that load."""
    index = said["index"]
    if said.get("error") or not isinstance(said.get("gbps"), (int, float)):
        why = said.get("error") or "no throughput measured"
        return None, f"GPU {index} could not be put under load ({why}); its idle link is not judged", []
    measured = f"under load (host→GPU {said['gbps']:.1f} GB/s)"
    if gpu is None:
        return None, f"GPU {index} {measured}; the stats agent did not list it", []
    causes = link_causes(gpu)
    if causes:
        # the throughput once, after the first cause's figures; each cause's fix goes to the row's fix
        words = [f"{what}{' ' + measured if n == 0 else ''}: {why}" for n, (what, why, _) in enumerate(causes)]
        return False, "; ".join(words), [fix for _, _, fix in causes]
    link = link_text(gpu.pcie.gen, gpu.pcie.width)
    if link == "unknown":
        return None, f"GPU {index} {measured}; its driver does not report the PCIe link", []
    return True, f"GPU {index} PCIe {link} {measured}", []


def _row(node: str, verdicts: list[tuple[bool | None, str, list[str]]]) -> Check:
    """One row of the GPUs' verdicts: ✗ if any GPU is held back, ✓ if every one was judged fine."""
    oks = [ok for ok, _, _ in verdicts]
    detail = "; ".join(text for _, text, _ in verdicts)
    if False in oks:
        fixes = list(dict.fromkeys(fix for _, _, found in verdicts for fix in found))
        fix = "; ".join(fixes)
        return Check(node, NAME, False, detail, fix[:1].upper() + fix[1:] + ".")
    return Check(node, NAME, True if oks and all(oks) else None, detail)
