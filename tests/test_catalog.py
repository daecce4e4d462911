"""Every catalogued mistake is rejected with feedback that names it (by its id, exactly);
every correct alternative is accepted, on the visible and the hidden inputs."""

from __future__ import annotations

import re

import pytest

from attention_ref.checks import _core, check, exercise_ids
from attention_ref.checks.mistakes import MISTAKES as NAMED
from attention_ref.checks.mistakes import mistake_id
from attention_ref.trust.secret import graded_seed
from attention_ref.trust.trusted import META_DEVICE_EXERCISES

from catalog import ALTERNATIVES, MISTAKES, Entry

HIDDEN = dict(seed=2024, thorough=True)
real_on_meta = _core.on_meta
#: Exercises whose entries run Triton's interpreter (1 to 10 s each on a quiet core, 5 to
#: 15 s in make test's four lanes): make test runs the first catalogued mistake of each,
#: make test-later (marked later) the other mistakes and every alternative (an alternative
#: runs the whole kernel: 3 to 7.5 s quiet).
SLOW_EXERCISES = (
    "triton_attention",
    "triton_causal_split",
    "triton_flash_attention",
    "triton_attention_backward",
)


def _params(entries: list[Entry], first_in_make_test: bool = True) -> list:
    seen: set[str] = set()
    out = []
    for e in entries:
        later = e.exercise in SLOW_EXERCISES and (e.exercise in seen or not first_in_make_test)
        seen.add(e.exercise)
        out.append(pytest.param(e, id=e.id, marks=[pytest.mark.later] if later else []))
    return out


@pytest.mark.parametrize("entry", _params(MISTAKES))
def test_mistake_is_caught_and_named(entry: Entry) -> None:
    # Caught on the visible inputs (the learner's self-check) ...
    with pytest.raises(AssertionError) as visible:
        check(entry.exercise, entry.impl)
    assert entry.mistake_id in NAMED, f"{entry.mistake_id!r} is not in checks/mistakes.py"
    named = mistake_id(str(visible.value))
    assert named == entry.mistake_id, (
        f"feedback names {named or 'no mistake'}, not {entry.mistake_id}:\n{visible.value}"
    )
    # ... and by the hidden tests used for grading.
    with pytest.raises(AssertionError):
        check(entry.exercise, entry.impl, **HIDDEN)


@pytest.mark.parametrize("entry", _params(ALTERNATIVES, first_in_make_test=False))
def test_correct_alternative_passes(entry: Entry, monkeypatch) -> None:
    on_meta: list[bool] = []

    def spy(*values):
        on_meta.append(real_on_meta(*values))
        return on_meta[-1]

    monkeypatch.setattr(_core, "on_meta", spy)
    check(entry.exercise, entry.impl)
    check(entry.exercise, entry.impl, **HIDDEN)
    # A graded kernel is warmed for the meta device exactly when its checks use it.
    assert any(on_meta) == (entry.exercise in META_DEVICE_EXERCISES), (
        f"{entry.exercise}: its check {'uses' if any(on_meta) else 'does not use'} the meta "
        "device; attention_ref/trust/trusted.py's META_DEVICE_EXERCISES says otherwise"
    )


#: Two grading secrets of two courses (attention_ref/trust/secret.py).
SECRETS = ("a" * 32 + "course-one", "b" * 32 + "course-two")


@pytest.mark.later
@pytest.mark.parametrize("entry", _params(ALTERNATIVES, first_in_make_test=False))
def test_correct_alternative_passes_the_hidden_checks_on_a_secret_s_seeds(entry: Entry) -> None:
    """Graded, a hidden check runs on a seed of the course's secret, not the source's
    2024: an honest answer passes whatever the seed."""
    for key in SECRETS:
        check(
            entry.exercise, entry.impl, seed=graded_seed(key, entry.exercise, 2024), thorough=True
        )


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_every_exercise_has_three_mistakes_and_two_alternatives(exercise_id: str) -> None:
    n_mistakes = sum(e.exercise == exercise_id for e in MISTAKES)
    n_alternatives = sum(e.exercise == exercise_id for e in ALTERNATIVES)
    assert n_mistakes >= 3, f"{exercise_id}: only {n_mistakes} catalogued mistakes"
    assert n_alternatives >= 2, f"{exercise_id}: only {n_alternatives} correct alternatives"


def test_mistake_ids_are_names_a_program_can_read() -> None:
    for mistake_id_ in NAMED:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", mistake_id_), mistake_id_
