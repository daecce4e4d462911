"""Record what the checks say about every catalogued candidate, to prove a refactoring
changed nothing but the code.

Runs through ``attention_ref.checks.check``, visibly (seed 0) and thoroughly (seed 2024,
``thorough=True``, as the hidden tests do):

- every catalogued mistake and correct alternative (``tests/catalog/``);
- the wrong-type candidates and the legal module variants of ``tests/test_checks_fuzz.py``.

and writes ``{"exercise|entry|mode": {"verdict": "pass"|"fail"|"error", "message": ...}}``
as JSON. Compare two recordings with ``--diff``::

    .venv/bin/python tools/record_verdicts.py /tmp/before.json
    ... change the checks ...
    .venv/bin/python tools/record_verdicts.py /tmp/after.json
    .venv/bin/python tools/record_verdicts.py --diff /tmp/before.json /tmp/after.json

``--only sdpa,masked_softmax`` records (or compares) only those exercises, for a quick
round while working on one file; finish with a whole recording. ``--diff`` exits 1 if
any verdict differs (or an entry is missing); changed messages are
listed, for the author to account for each. ``--messages-only`` leaves the listing out.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = {"visible": dict(), "thorough": dict(seed=2024, thorough=True)}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _run(check, exercise: str, candidate) -> dict[str, str]:
    out = {}
    for mode, kwargs in MODES.items():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                check(exercise, candidate, **kwargs)
        except AssertionError as err:
            out[mode] = {"verdict": "fail", "message": _ADDRESS.sub(" at 0x?", str(err))}
        except Exception as err:  # noqa: BLE001 - recorded, never raised
            out[mode] = {"verdict": "error", "message": f"{type(err).__name__}: {err}"}
        else:
            out[mode] = {"verdict": "pass", "message": ""}
    return out


def _candidates():
    """``(exercise, entry name, candidate)`` for everything recorded."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import test_checks_fuzz as fuzz

    from catalog import ALTERNATIVES, MISTAKES

    for e in MISTAKES:
        yield e.exercise, f"mistake:{e.name}", e.impl
    for e in ALTERNATIVES:
        yield e.exercise, f"alternative:{e.name}", e.impl
    for p in fuzz.WRONG:
        ex, name, cand = p.values
        yield ex, f"wrong:{name}", cand
    for p in fuzz.LEGAL:
        ex, variant = p.values
        yield ex, f"legal:{variant}", fuzz.VARIANTS[variant](fuzz._module_alternative(ex))


class _Kernel:
    """A second process that plays a graded kernel: it holds the candidates and serves the
    checker (this process) for each check, as a notebook's kernel does under grading."""

    def __init__(self) -> None:
        import subprocess
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="verdicts-")
        self.path = os.path.join(self.dir, "checker.sock")
        import socket

        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        env = {**os.environ, "ATTENTION_REF_CHECKER": self.path, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, index: int, exercise: str, mode: str) -> dict[str, str]:
        from attention_ref.trust.checker import Expected, judge

        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        conn, _ = self.server.accept()
        with conn:
            verdict = judge(conn, Expected(exercise, **MODES[mode]))
        self.proc.stdout.readline()
        if verdict.get("passed"):
            return {"verdict": "pass", "message": ""}
        if verdict.get("error"):
            return {"verdict": "error", "message": f"{verdict['error']}: {verdict['message']}"}
        return {"verdict": "fail", "message": _ADDRESS.sub(" at 0x?", verdict["message"])}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _serve() -> int:
    """The kernel's side of ``--remote``: candidate number N, checked when asked."""
    import torch

    torch.set_num_threads(1)
    from attention_ref.checks import check

    entries = list(_candidates())
    for line in sys.stdin:
        exercise, _, candidate = entries[int(line)]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                check(exercise, candidate)
        except BaseException:  # noqa: BLE001 - the checker has the verdict
            pass
        print("done", flush=True)
    return 0


def record(path: str, only: set[str] | None = None, remote: bool = False) -> None:
    import torch

    torch.set_num_threads(1)
    from attention_ref.checks import check

    results: dict[str, dict[str, str]] = {}
    t0 = time.monotonic()
    kernel = _Kernel() if remote else None
    for index, (exercise, name, candidate) in enumerate(_candidates()):
        if only and exercise not in only:
            continue
        if kernel is not None:
            verdicts = {mode: kernel.run(index, exercise, mode) for mode in MODES}
        else:
            verdicts = _run(check, exercise, candidate)
        for mode, res in verdicts.items():
            key = f"{exercise}|{name}|{mode}"
            if key in results:
                raise SystemExit(f"two entries record as {key}")
            results[key] = res
    if kernel is not None:
        kernel.close()
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, ensure_ascii=False)
    print(f"{len(results)} verdicts in {time.monotonic() - t0:.0f} s -> {path}")


def _strip_id(message: str) -> str:
    """The message without its ``[mistake: id]`` line (compared separately)."""
    return re.sub(r"\n  \[mistake: [a-z0-9_]+\]", "", message)


def diff(
    before_path: str, after_path: str, listing: bool = True, only: set[str] | None = None
) -> int:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    if only:
        before = {k: v for k, v in before.items() if k.split("|")[0] in only}
        after = {k: v for k, v in after.items() if k.split("|")[0] in only}
    missing = sorted(set(before) - set(after))
    added = sorted(set(after) - set(before))
    verdicts = [k for k in before if k in after and before[k]["verdict"] != after[k]["verdict"]]
    messages = [
        k
        for k in before
        if k in after
        and before[k]["verdict"] == after[k]["verdict"]
        and _strip_id(before[k]["message"]) != _strip_id(after[k]["message"])
    ]

    # The learner's line is quoted by number: moving a catalogued candidate in its file
    # changes only that number, not the check.
    def unnumbered(k: str, d: dict) -> str:
        return re.sub(r"Your code raised it at line \d+", "", _strip_id(d[k]["message"]))

    def named(d: dict, k: str) -> str:
        found = re.search(r"\n  \[mistake: ([a-z0-9_]+)\]$", d[k]["message"])
        return found.group(1) if found else ""

    renamed = [
        k for k in before if k in after and named(before, k) and named(before, k) != named(after, k)
    ]
    moved = [k for k in messages if unnumbered(k, before) == unnumbered(k, after)]
    messages = [k for k in messages if k not in moved]
    same = sum(1 for k in before if k in after and before[k]["verdict"] == after[k]["verdict"])
    print(
        f"compared {len(before)} recorded verdicts: {same} identical verdicts, "
        f"{len(verdicts)} changed verdicts, {len(missing)} missing, {len(added)} new; "
        f"{len(messages)} changed messages (ignoring the [mistake: id] line; {len(moved)} more "
        "differ only in the line number of the candidate's own code); "
        f"{len(renamed)} mistakes named by another id"
    )
    for k in verdicts:
        was, now = before[k]["verdict"], after[k]["verdict"]
        print(f"VERDICT {k}: {was} -> {now}\n{after[k]['message']}")
    for k in missing:
        print(f"MISSING {k}")
    for k in renamed:
        print(f"MISTAKE ID {k}: {named(before, k)} -> {named(after, k) or 'none'}")
    if listing:
        for k in messages:
            print(f"--- {k}\n{before[k]['message']}\n+++\n{after[k]['message']}\n")
    return 1 if verdicts or missing or renamed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="OUT.json, or BEFORE.json AFTER.json with --diff")
    ap.add_argument("--diff", action="store_true")
    ap.add_argument("--messages-only", action="store_true", help="with --diff: counts only")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated exercise ids: record (or compare) only these exercises",
    )
    ap.add_argument(
        "--remote",
        action="store_true",
        help="record as grading decides: each check in this process (the trusted checker), "
        "each candidate in a second process that serves it (the kernel)",
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    if "--serve" in sys.argv:
        return _serve()
    args = ap.parse_args()
    only = {e for e in args.only.split(",") if e} or None
    if only:
        sys.path.insert(0, ROOT)
        from attention_ref.checks import exercise_ids

        unknown = sorted(only - set(exercise_ids()))
        if unknown:
            ap.error(
                f"--only: no exercise {', '.join(unknown)}; the ids: {', '.join(exercise_ids())}"
            )
    if args.diff:
        return diff(*args.paths, listing=not args.messages_only, only=only)
    record(args.paths[0], only, remote=args.remote)
    return 0


if __name__ == "__main__":
    sys.exit(main())
