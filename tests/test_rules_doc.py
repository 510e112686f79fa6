"""Every rule code cited in the code, tests and docs has an entry in docs/rules.md."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from _support import REPO

RULES = REPO / "docs" / "rules.md"
SCANNED = ("core", "plugins", "docs", "tests")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".json", ".ini", ".cfg"}
#: The families of the reference behaviour (longest first, so CB is not read as C + B).
PREFIXES = sorted(
    [
        "B",
        "C",
        "CB",
        "CC",
        "D",
        "DH",
        "DS",
        "EG",
        "ER",
        "EV",
        "GA",
        "GP",
        "I",
        "IN",
        "K",
        "L",
        "M",
        "MD",
        "NR",
        "OW",
        "PM",
        "P",
        "PM",
        "PP",
        "Q",
        "QA",
        "R",
        "RD",
        "PL",
        "PG",
        "S",
        "SF",
        "SG",
        "SP",
        "SV",
    ],
    key=len,
    reverse=True,
)
_FAMILY = "|".join(PREFIXES)
CODE = re.compile(rf"\b({_FAMILY})(\d+)[a-z]?\b")
RANGE = re.compile(rf"\b({_FAMILY})(\d+)\s*[–—-]\s*(?:\1)?(\d+)\b")
#: Linter codes in suppression comments are not rules (``# noqa: S101``).
NOQA = re.compile(r"#\s*noqa:[^\n]*")
PLACE = re.compile(r"`((?:hostler|hostler_[a-z0-9]+)(?:\.\w+)+|tests/[\w/]+\.py)`")
ENTRY = re.compile(rf"^### ({_FAMILY})(\d+) — \S", re.MULTILINE)


def cited_codes(text: str) -> set[str]:
    """Codes cited in ``text``, ranges (``S1–S7``) expanded to every code they span."""
    text = NOQA.sub("", text)
    codes = {f"{family}{number}" for family, number in CODE.findall(text)}
    for family, low, high in RANGE.findall(text):
        if int(low) < int(high) <= int(low) + 50:
            codes.update(f"{family}{n}" for n in range(int(low), int(high) + 1))
    return codes


def documented_codes() -> set[str]:
    """The codes docs/rules.md has an entry (``### CODE — title``) for."""
    return {f"{family}{number}" for family, number in ENTRY.findall(RULES.read_text())}


def _files() -> list[Path]:
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*")):
            wanted = path.suffix in SUFFIXES and "__pycache__" not in path.parts
            if wanted and path.is_file() and path != RULES:
                found.append(path)
    return found


def test_the_scanner_reads_codes_ranges_and_skips_linter_codes() -> None:
    assert cited_codes("rules CB5 and C1, L14; B1–B3; S6-S7; K2–3") == {
        "CB5",
        "C1",
        "L14",
        "B1",
        "B2",
        "B3",
        "S6",
        "S7",
        "K2",
        "K3",
    }
    assert cited_codes("assert x  # noqa: S101 - fine") == set()
    assert cited_codes("L14a, IN9.") == {"L14", "IN9"}
    assert cited_codes("CB7B ABC1 C1D x86 sha256 GiB1 B2B") == set()


def test_every_cited_rule_code_is_in_docs_rules_md() -> None:
    documented = documented_codes()
    missing: dict[str, list[str]] = {}
    for path in _files():
        for code in cited_codes(path.read_text(encoding="utf-8", errors="replace")):
            if code not in documented:
                missing.setdefault(code, []).append(str(path.relative_to(REPO)))
    assert not missing, "cited but not in docs/rules.md: " + "; ".join(
        f"{code} ({', '.join(paths[:3])})" for code, paths in sorted(missing.items())
    )


def _resolves(reference: str) -> bool:
    """Whether ``hostler.a.b.name`` (module, then attributes) or ``tests/x.py`` exists."""
    if reference.startswith("tests/"):
        return (REPO / reference).is_file()
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_entry_states_the_rule_and_names_where_it_lives() -> None:
    text = RULES.read_text()
    entries = re.split(r"^### ", text, flags=re.MULTILINE)[1:]
    assert len(entries) == len(documented_codes()) >= 60
    for entry in entries:
        code, _, body = entry.partition("\n")
        places = PLACE.findall(body)
        assert places, f"{code}: names no module, function or test file"
        for place in places:
            assert _resolves(place), f"{code}: `{place}` does not exist"
        assert len(body.split()) >= 15, f"{code}: too short to state the rule"
