"""What identifies a student, taken out of a text that a report shows to others: one
function, used by the class report (the examples of feedback) and the similar-answers list
(the cells it quotes). Only the standard library."""

from __future__ import annotations

import re


def anonymise(text: str, who: list[str]) -> str:
    """``text`` without the identifiers in ``who`` (a student's id, names, email), email
    addresses, home folders and paths, and without the ``[mistake: ...]`` line."""
    lines = [ln for ln in text.rstrip().splitlines() if not ln.strip().startswith("[mistake: ")]
    out = "\n".join(lines)
    out = re.sub(r"[\w.+-]+@[\w-]+(\.[\w-]+)+", "<email>", out)
    # A path: two or more /segments not glued to a word ("1/sqrt(d_k)" is no path), or
    # one that starts with a drive letter.
    out = re.sub(r"(?<![\w)\]])~?(?:/[\w.@+-]+){2,}/?", "<path>", out)
    out = re.sub(r"\b[A-Za-z]:\\[^\s'\"]*", "<path>", out)
    for w in sorted({w for w in who if w and len(w) > 1}, key=len, reverse=True):
        out = re.sub(rf"(?<![\w-]){re.escape(w)}(?![\w-])", "<student>", out, flags=re.IGNORECASE)
    return out
