"""Every `See Note [...]` reference in the sources names a Note that is defined somewhere, and the
README's Notes index lists every defined Note (so neither goes stale)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("csrc", "python") for p in (ROOT / d).rglob("*") if p.suffix in {".h", ".cpp", ".py"}]
DEFINITION = re.compile(r"^\s*(?://|#) Note \[([^\]]+)\]\s*$", re.M)
REFERENCE = re.compile(r"Note \[([^\]]+)\]")


def _definitions():
    return {m.group(1) for p in SOURCES for m in DEFINITION.finditer(p.read_text())}


def test_sources_define_notes():
    assert len(_definitions()) >= 10


def test_every_reference_resolves():
    defined = _definitions()
    dangling = {
        (p.name, m.group(1))
        for p in SOURCES
        for m in REFERENCE.finditer(p.read_text())
        if m.group(1) not in defined
    }
    assert dangling == set()


def test_readme_indexes_every_note():
    readme = (ROOT / "README.md").read_text()
    assert {n for n in _definitions() if f"[{n}]" not in readme} == set()
