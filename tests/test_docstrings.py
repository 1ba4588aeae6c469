"""Docstrings in src/ say what a thing is, its units and its contract; benchmark figures and
the history of a change belong in ``benchmarks/results/`` (STYLE.md, section 11).

The check: no docstring (module, class, function, or the string after an assignment)
quotes a percent figure, or a number of "points", within a sentence's reach of an
accuracy word (MAPE, APE, error, coverage, held-out ...). A figure that is a contract
(the nominal "90% interval") is allowed by :data:`CONTRACT_PATTERNS`, a single place by
:data:`ALLOWED` with its reason, and a file another change owns by :data:`PENDING`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "perfcast"
FIGURE = re.compile(r"[±+-]?\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?\s+(?:MAPE\s+)?points\b")
ACCURACY = re.compile(
    r"\bMAPE\b|\bAPE\b|\b(?:errors?|coverage|covers|accuracy|held[- ]out|leave-one-\w+-out)\b", re.IGNORECASE
)
REACH = 100
"""Characters on each side of a figure searched for an accuracy word."""
CONTRACT_PATTERNS = (re.compile(r"\d+\s?% interval"),)
"""Figures that state a contract, not a result: the nominal coverage of an interval."""
ALLOWED = {
    ("training/plots.py", "±20%"): "the plot draws a ±20% band: what the picture shows, not a result",
}
"""(file relative to src/perfcast, the figure as written) -> why it may stay."""
PENDING: dict[str, str] = {}
"""Files another change owns, skipped until it moves their figures; remove the entry then."""


def _docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string statement: docstrings and attribute docstrings."""
    return [
        (node.lineno, node.value.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]


def _allowed(path: str, text: str, start: int, end: int) -> bool:
    if any(p.match(text, start) for p in CONTRACT_PATTERNS):
        return True
    return (path, text[start:end].strip()) in ALLOWED


def find_lab_figures() -> list[str]:
    """``path:line: context`` of every benchmark-like figure in a src/ docstring."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in PENDING:
            continue
        for line, text in _docstrings(ast.parse(path.read_text(encoding="utf-8"))):
            for match in FIGURE.finditer(text):
                start, end = match.start(), match.end()
                window = text[max(0, start - REACH) : end + REACH]
                if not ACCURACY.search(window) or _allowed(rel, text, start, end):
                    continue
                context = " ".join(text[max(0, start - 60) : end + 30].split())
                found.append(f"{rel}:{line + text[:start].count(chr(10))}: ...{context}...")
    return found


def test_no_docstring_quotes_a_benchmark_figure() -> None:
    found = find_lab_figures()
    assert not found, (
        "docstrings quote benchmark figures; move them to benchmarks/results/*.md and keep the contract:\n"
        + "\n".join(found)
    )


def test_the_check_sees_a_figure() -> None:
    text = '"""The GBDT went from 14.1% to 7.4% MAPE."""\nX = 1\n"""A 90% interval, in ms."""\n'
    docs = _docstrings(ast.parse(text))
    hits = [m for _, d in docs for m in FIGURE.finditer(d) if ACCURACY.search(d) and not _allowed("x.py", d, *m.span())]
    assert [m.group() for m in hits] == ["14.1%", "7.4%"]
