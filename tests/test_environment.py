"""requirements.lock, pyproject.toml and environment.yml agree, and the environment the
tests run in is the locked one."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: Pins that hold on some platforms only (Triton has Linux wheels only): lock, environment.yml
#: and pyproject.toml give each the same marker.
MARKERS = {"triton": Marker('sys_platform == "linux"')}


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)(?:; (.+))?", line)
        assert m, f"requirements.lock line is not an exact pin: {line!r}"
        assert m.group(3) is None or Marker(m.group(3)) == MARKERS.get(m.group(1)), (
            f"requirements.lock: {line!r} has a marker pyproject.toml does not give it"
        )
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{name} is pinned twice in requirements.lock"
        pins[name] = m.group(2)
    return pins


def env_pins() -> tuple[dict[str, str], str]:
    text = (ROOT / "environment.yml").read_text()
    pins, python = {}, ""
    for line in text.splitlines():
        m = re.fullmatch(r"\s+- ([A-Za-z0-9_.\-]+)==([^\s;]+)(?:; .+)?", line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
        m = re.fullmatch(r"\s+- python=(\S+)", line)
        if m:
            python = m.group(1)
    return pins, python


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def declared_requirements() -> list[Requirement]:
    project = pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [Requirement(r) for r in reqs]


def test_torch_is_pinned_to_2_13_0_everywhere():
    assert lock_pins()["torch"] == "2.13.0"
    assert env_pins()[0]["torch"] == "2.13.0"


def test_environment_yml_pins_exactly_the_lock():
    env, _ = env_pins()
    lock = lock_pins()
    assert set(env) == set(lock), (
        f"only in environment.yml: {sorted(set(env) - set(lock))}; "
        f"only in the lock: {sorted(set(lock) - set(env))}"
    )
    differing = {n: (env[n], lock[n]) for n in lock if env[n] != lock[n]}
    assert not differing, f"versions differ (environment.yml, lock): {differing}"


def test_environment_yml_python_satisfies_requires_python():
    _, python = env_pins()
    spec = Requirement(f"python{pyproject()['project']['requires-python']}").specifier
    assert python and Version(python) in spec


@pytest.mark.parametrize("req", declared_requirements(), ids=str)
def test_every_pyproject_dependency_is_locked_within_its_range(req: Requirement):
    pins = lock_pins()
    name = canonicalize_name(req.name)
    assert name in pins, f"{req.name} is in pyproject.toml but not in requirements.lock"
    assert Version(pins[name]) in req.specifier, (
        f"requirements.lock pins {req.name}=={pins[name]}, outside pyproject's {req}"
    )


def test_platform_markers_agree_in_the_three_files():
    declared = {canonicalize_name(r.name): r.marker for r in declared_requirements()}
    env_text = (ROOT / "environment.yml").read_text()
    for name, marker in MARKERS.items():
        assert declared[name] == marker, f"pyproject.toml: {name} should say ; {marker}"
        assert f"{name}=={lock_pins()[name]}; {marker}" in env_text, f"environment.yml: {name}"


def test_the_running_environment_is_the_locked_one():
    mismatched = {}
    for name, pinned in lock_pins().items():
        if name in MARKERS and not MARKERS[name].evaluate():
            continue  # not installed on this platform
        try:
            installed = version(name)
        except PackageNotFoundError:
            mismatched[name] = (pinned, "missing")
            continue
        if Version(installed).public != Version(pinned).public:
            mismatched[name] = (pinned, installed)
    assert not mismatched, (
        f"installed versions differ from the lock (lock, installed): "
        f"{mismatched}; run `make test` to reinstall"
    )
