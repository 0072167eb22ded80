"""The LAN tier's longest test modules, from its JUnit XML (tests/run.sh): with --dist loadscope a module's tests
run one after another on one worker, so the longest module is a floor under the tier's time, and a module far
over the others is one to split."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter


def module_seconds(junit_xml: str) -> Counter[str]:
    """Seconds per test module (setup, call and teardown of each of its tests)."""
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        totals[case.get("classname", "").split(".")[-1] or "?"] += float(case.get("time") or 0)
    return totals


def main(junit_xml: str, shown: int = 10) -> None:
    totals = module_seconds(junit_xml)
    print(f"the {min(shown, len(totals))} longest of {len(totals)} modules (one worker runs each, test after test):")
    for module, seconds in totals.most_common(shown):
        print(f"  {seconds / 60:5.1f} min  {module}")


if __name__ == "__main__":
    main(sys.argv[1])
