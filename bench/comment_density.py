"""Comment lines per 100 code lines, overall and per package, for the review of issue 38.

A comment line is a line that holds only a `#` comment (the measure issue 38 quotes; its anchors and
this script's figures are in bench/README.md); comments after code on the same line are counted apart.
A code line is a non-blank line that holds code and is not part of a docstring (any bare string
statement).

    python bench/comment_density.py [ROOT ...]        # default: appliance tui
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

# Tokens that are not code: a line holding only these (and comments) is not a code line.
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of every bare string statement (module, class, function and attribute docstrings)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def count(text: str) -> tuple[int, int, int]:
    """(comment lines alone, comments after code, code lines) of one Python source."""
    docs = _docstring_lines(ast.parse(text))
    comment_lines: set[int] = set()
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comment_lines.add(tok.start[0])
        elif tok.type not in _NOT_CODE:
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    code_lines -= docs
    return len(comment_lines - code_lines), len(comment_lines & code_lines), len(code_lines)


def package_of(path: Path, root: Path) -> str:
    """`appliance/budget` for appliance/budget/fit.py; the root itself for its top-level modules."""
    parts = path.relative_to(root.parent).parts
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def density(roots: list[Path]) -> dict[str, tuple[int, int, int]]:
    """Package -> count()'s three sums, with an 'all' row over every root."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            counts = count(path.read_text())
            for key in (package_of(path, root), "all"):
                totals[key] = [a + b for a, b in zip(totals[key], counts)]
    return {key: (alone, after, code) for key, (alone, after, code) in totals.items()}


def main(argv: list[str]) -> None:
    roots = [Path(a).resolve() for a in (argv or ["appliance", "tui"])]
    rows = density(roots)
    print(f"{'package':<22} {'comments':>8} {'code':>7} {'per 100':>8} {'+ after code':>13}")
    for key in sorted(rows, key=lambda k: (k == "all", k)):
        alone, after, code = rows[key]
        per_100 = 100 * alone / max(code, 1)
        with_after = 100 * (alone + after) / max(code, 1)
        print(f"{key:<22} {alone:>8} {code:>7} {per_100:>8.1f} {with_after:>13.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
