"""ruff is clean over the package, the tests, the tools and the notebooks (solutions/ and
the generated notebooks/: ruff reads .ipynb)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["attention_ref", "tests", "tools", "nbgrader_config.py", "solutions", "notebooks"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *PATHS], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_is_clean():
    proc = ruff("check", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean():
    proc = ruff("format", "--check", "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
