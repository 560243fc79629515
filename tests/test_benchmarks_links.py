"""BENCHMARKS.md cites run-log sections as reference links (`["Runs of ..."]`): every one it
uses has a definition, and every definition points at a heading that benchmarks/results/RUNS.md
has (GitHub's anchor of it), so a renamed or missing section shows here."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_run_log_references_resolve():
    text = (ROOT / "BENCHMARKS.md").read_text()
    runs = (ROOT / "benchmarks" / "results" / "RUNS.md").read_text()
    anchors = {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", runs, re.MULTILINE)}
    definitions = {}
    for label, target in re.findall(r'^\["([^"]+)"\]: (\S+)$', text, re.MULTILINE):
        definitions[" ".join(label.lower().split())] = target
    # labels are matched as Markdown does: case-insensitive, runs of whitespace as one space
    used = {" ".join(u.lower().split()) for u in re.findall(r'\["([^"]+)"\](?!:)', text)}
    assert len(used) > 20  # the pattern still finds them
    assert not sorted(used - set(definitions)), "references without a definition"
    broken = sorted(label for label, target in definitions.items()
                    if target.startswith("benchmarks/results/RUNS.md#")
                    and target.split("#", 1)[1] not in anchors)
    assert not broken, f"definitions whose RUNS.md heading is gone: {broken}"
