"""The course's grading secret: the seeds of the graded (hidden) checks.

A hidden test cell says ``_fresh_check("sdpa", sdpa, seed=2024, thorough=True)``, and the
notebook, the course's source and the checks' case functions are public: a kernel that
reads the seed could rebuild the check's inputs before the cell runs and answer from a
table. So under grading the trusted checker does not use the source's seed for a thorough
check: it derives one from the seed, the exercise and a secret of the instructor's
(:func:`graded_seed`), stable across regrades, never in a notebook or a kernel.

The secret is ``ATTENTION_REF_GRADING_SECRET`` when set (a class graded on several
machines shares it), otherwise the file ``.grading_secret`` in the course root, made on
the first ``make grade`` (random, readable by its owner only). The grader hands it to its
checker and, with each job, to a cluster's workers; a sandboxed kernel sees neither the
variable nor the course root. The self-check's own inputs (``check("sdpa", sdpa)``, the
learner's seed) stay those of the notebook: the learner's feedback is the same graded or
not.

Only the standard library: the checker and the grader both import this.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

#: The secret itself, where the grader sets it (the file's content otherwise).
SECRET_ENV = "ATTENTION_REF_GRADING_SECRET"
#: The file in the course root that holds the secret when the variable is not set.
SECRET_FILE = ".grading_secret"
#: The fewest characters a secret may have (32 random hex digits: 128 bits).
MIN_LENGTH = 32


def _valid(secret: str, where: str) -> str:
    secret = secret.strip()
    if len(secret) < MIN_LENGTH:
        raise ValueError(
            f"the grading secret in {where} has {len(secret)} characters; expected at least "
            f"{MIN_LENGTH} (make one with: python -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    return secret


def course_secret(root: Path) -> str:
    """The grading secret of the course at ``root``: ``ATTENTION_REF_GRADING_SECRET`` if set,
    else the content of ``root/.grading_secret``, made (64 random hex digits, mode 0600) the
    first time. Raises ValueError for a secret too short to be one."""
    raw = os.environ.get(SECRET_ENV, "")
    if raw.strip():
        return _valid(raw, SECRET_ENV)
    path = Path(root) / SECRET_FILE
    try:
        return _valid(path.read_text(encoding="ascii"), str(path))
    except FileNotFoundError:
        pass
    secret = secrets.token_hex(32)
    # O_EXCL: two graders starting at once keep the first one's secret.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _valid(path.read_text(encoding="ascii"), str(path))
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secret + "\n")
    return secret


def graded_seed(secret: str, exercise: str, seed: int) -> int:
    """The seed a graded thorough check of ``exercise`` runs with, in place of the source's
    ``seed``: 31 bits of HMAC-SHA256(secret, exercise and seed). The same secret gives the
    same seed (a regrade gives the same grade); without the secret it cannot be told."""
    message = f"{exercise}\0{int(seed)}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
