"""Write requirements.lock and environment.yml from a resolved environment (`make lock`).

    python tools/lock.py VENV requirements.lock environment.yml

Reads the exact versions installed in VENV (which `make lock` fills from pyproject's
ranges), pins torch to its public version (the CPU build's "+cpu" suffix dropped), and
writes the two files. tests/test_environment.py checks they agree with pyproject.toml.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SKIP = {"attention-ref", "attention_ref", "pip"}
#: Packages installed on some platforms only, with the marker pyproject.toml gives them.
MARKERS = {"triton": 'sys_platform == "linux"'}


def frozen(venv: Path) -> list[str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pins = []
    for line in out.splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        name, version = line.split("==", 1)
        if name.lower() in SKIP:
            continue
        marker = f"; {MARKERS[name.lower()]}" if name.lower() in MARKERS else ""
        pins.append(f"{name}=={version.split('+', 1)[0]}{marker}")
    return sorted(pins, key=str.lower)


def main(venv: str, lock: str, env_yml: str) -> None:
    pins = frozen(Path(venv))
    Path(lock).write_text(
        "# Exact versions used by make, CI and environment.yml. Regenerate with: make lock\n"
        + "\n".join(pins)
        + "\n"
    )
    lines = [
        "# Conda environment with the same exact versions as requirements.lock.",
        "# tests/test_environment.py fails when the two drift apart.",
        "name: attention-from-scratch",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        "  - python=3.11",
        "  - pip",
        "  - pip:",
        *[f"      - {p}" for p in pins],
        "      - -e .",
    ]
    Path(env_yml).write_text("\n".join(lines) + "\n")
    print(f"wrote {len(pins)} pins to {lock} and {env_yml}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
