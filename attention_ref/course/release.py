"""``make release``: regenerate the student notebooks (notebooks/) from solutions/."""

from __future__ import annotations

from pathlib import Path

from .plumbing import assignments, nbgrader_api


def _pick(root: Path, requested: list[str]) -> list[str]:
    known = assignments(root)
    unknown = [a for a in requested if a not in known]
    if unknown:
        raise SystemExit(
            f"error: unknown assignment(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return requested or known


def release(root: Path, requested: list[str]) -> list[str]:
    """Regenerate the student notebooks of ``requested`` (all by default): nbgrader's
    ``generate_assignment --force`` for each, through its Python API in this one process
    (one start-up and one gradebook connection for all of them)."""
    aids = _pick(root, requested)
    api = nbgrader_api(root)
    done = []
    for aid in aids:
        result = api.generate_assignment(aid, force=True)
        if not result["success"]:
            raise SystemExit(
                f"error: `nbgrader generate_assignment {aid} --force` failed:\n"
                f"{result.get('log') or ''}{result.get('error') or ''}"
            )
        print(f"released {aid} -> notebooks/{aid}/")
        done.append(aid)
    return done
