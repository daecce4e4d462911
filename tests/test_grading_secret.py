"""The seeds of the graded checks come from a secret of the course's
(attention_ref/trust/secret.py), never from the notebook; no graded kernel gets it."""

from __future__ import annotations

import stat

import pytest

from attention_ref.trust import sandbox, secret
from attention_ref.trust.checker import seed_for
from attention_ref.trust.trusted import Expected, expected_checks

HIDDEN_CELL = 'check("sdpa", sdpa)\n_fresh_check("sdpa", sdpa, seed=2024, thorough=True)\n'


def test_the_first_grading_makes_a_private_secret_that_later_ones_reuse(tmp_path, monkeypatch):
    monkeypatch.delenv(secret.SECRET_ENV, raising=False)
    first = secret.course_secret(tmp_path)
    path = tmp_path / secret.SECRET_FILE
    assert len(first) >= secret.MIN_LENGTH
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret.course_secret(tmp_path) == first  # a regrade: the same seeds
    other = tmp_path / "other"
    other.mkdir()
    assert secret.course_secret(other) != first  # another course: other seeds


def test_the_variable_overrides_the_file_and_a_short_secret_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(secret.SECRET_ENV, "s" * 40)
    assert secret.course_secret(tmp_path) == "s" * 40
    assert not (tmp_path / secret.SECRET_FILE).exists()
    monkeypatch.setenv(secret.SECRET_ENV, "2024")
    with pytest.raises(ValueError, match="at least 32"):
        secret.course_secret(tmp_path)
    monkeypatch.delenv(secret.SECRET_ENV)
    (tmp_path / secret.SECRET_FILE).write_text("short\n")
    with pytest.raises(ValueError, match=secret.SECRET_FILE):
        secret.course_secret(tmp_path)


def test_a_hidden_check_runs_on_the_secret_s_seed_and_the_self_check_on_its_own():
    visible, hidden = expected_checks(HIDDEN_CELL)
    key = "k" * 64
    assert seed_for(visible, key) == 0  # the learner's feedback is the same graded or not
    graded = seed_for(hidden, key)
    assert graded != 2024 and 0 <= graded < 2**31
    assert graded == secret.graded_seed(key, "sdpa", 2024) == seed_for(hidden, key)
    assert seed_for(hidden, "j" * 64) != graded  # depends on the secret
    assert seed_for(Expected("sdpa_np", 2024, True), key) != graded  # and on the exercise
    assert seed_for(hidden, "") == 2024  # no secret (a self-check run by hand): the source's


def test_no_graded_kernel_is_given_the_secret():
    env = sandbox.kernel_env({secret.SECRET_ENV: "s" * 40, "ATTENTION_REF_TIME_LIMIT": "2"})
    assert secret.SECRET_ENV not in env
    assert env["ATTENTION_REF_TIME_LIMIT"] == "2"  # the other settings still reach it
