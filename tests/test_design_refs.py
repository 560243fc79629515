"""Every pointer from the code (the package, the benchmarks and the tests) into docs/design.md
(`docs/design.md, "Section"`) names one of its headings, so that a renamed or removed section
shows here and not in a reader's search."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _headings() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, re.MULTILINE)}


def _references() -> list[tuple[str, str]]:
    refs = []
    paths = [p for folder in ("pagedrt", "benchmarks", "tests")
             for p in sorted((ROOT / folder).rglob("*.py"))]
    for path in paths:
        if path == pathlib.Path(__file__).resolve():  # (its docstring's example)
            continue
        # a reference may wrap over lines of a docstring or of a comment
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())
        refs += [(str(path.relative_to(ROOT)), m.group(1))
                 for m in re.finditer(r'docs/design\.md,? "([^"]+)"', text)]
    return refs


def test_code_points_at_sections_that_exist():
    headings = _headings()
    refs = _references()
    assert len(refs) > 20  # the pattern still finds them
    missing = sorted({(path, name) for path, name in refs if name not in headings})
    assert not missing, f"docs/design.md has no heading for: {missing}"


def test_the_contents_list_matches_the_headings():
    """design.md's "Contents" lists every heading below it (## and ###, code blocks left out)
    in order, each linked to its GitHub anchor: a section added or renamed without its entry
    shows here."""
    text = (ROOT / "docs" / "design.md").read_text()
    body = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    headings = [(len(m.group(1)), m.group(2).strip())
                for m in re.finditer(r"^(##+)\s+(.+)$", body, re.MULTILINE)]
    assert headings[0] == (2, "Contents")
    entries = re.findall(r"^( *)- \[(.+)\]\(#([^)]+)\)$",
                         body.split("## Contents", 1)[1].split("\n## ", 1)[0], re.MULTILINE)
    expected = [(level, title, re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-"))
                for level, title in headings[1:]]
    assert [(2 + len(indent) // 2, title, anchor) for indent, title, anchor in entries] == expected
