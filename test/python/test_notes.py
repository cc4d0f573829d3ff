"""Every `Note [...]` referenced anywhere in the repository is defined in the sources, the Notes
index (docs/notes.md) lists every defined Note, and the file the index names for a Note holds its
definition (so neither the references nor the index go stale)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("csrc", "python", "cmake")
SUFFIXES = {".h", ".cpp", ".py", ".cmake"}
DEFINITION = re.compile(r"^\s*(?://|#) Note \[([^\]]+)\]\s*$", re.M)
REFERENCE = re.compile(r"Note \[([^\]]+)\]")
INDEX_ROW = re.compile(r"^\| `\[([^\]]+)\]` \| `([^`]+)` \|$", re.M)
INDEX = ROOT / "docs" / "notes.md"


def _files(dirs, suffixes):
    return [p for d in dirs for p in (ROOT / d).rglob("*") if p.suffix in suffixes and p.is_file()]


def _definitions():
    """{title: [files defining it]} over the sources."""
    found = {}
    for p in _files(SOURCE_DIRS, SUFFIXES):
        for m in DEFINITION.finditer(p.read_text()):
            found.setdefault(m.group(1), []).append(p.relative_to(ROOT).as_posix())
    return found


def _index():
    """{title: file} from the index's rows."""
    return dict(INDEX_ROW.findall(INDEX.read_text()))


def test_sources_define_notes():
    assert len(_definitions()) >= 20


def test_each_note_is_defined_once():
    assert {t: fs for t, fs in _definitions().items() if len(fs) > 1} == {}


def test_every_reference_resolves():
    # References in code, tests, tools, benchmarks and docs alike.
    defined = _definitions()
    places = _files(("csrc", "python", "test", "tools", "benchmarks", "docs", "examples"),
                    SUFFIXES | {".md", ".sh", ".txt"}) + [ROOT / "README.md"]
    placeholders = {"...", "Title"}  # how this file and docs/notes.md describe the syntax
    dangling = {
        (p.relative_to(ROOT).as_posix(), title)
        for p in places
        for title in (" ".join(m.group(1).split()) for m in REFERENCE.finditer(p.read_text()))
        if title not in defined and title not in placeholders
    }
    assert dangling == set()


def test_index_lists_every_note():
    index = _index()
    assert set(_definitions()) - set(index) == set()


def test_index_names_the_defining_file():
    defined = _definitions()
    wrong = {t: (f, defined.get(t)) for t, f in _index().items() if f not in defined.get(t, [])}
    assert wrong == {}
