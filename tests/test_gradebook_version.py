"""A new gradebook is stamped with nbgrader's schema revision, read in-process
(attention_ref.course.plumbing) rather than by nbgrader's `alembic heads` subprocess."""

import os
import sqlite3
import subprocess
import sys

import nbgrader.api
from nbgrader.dbutil import _temp_alembic_ini

from attention_ref.course.cluster import build_template
from attention_ref.course.plumbing import gradebook_schema_version
from tests.course_tools import make_course


def test_the_revision_read_in_process_is_the_one_alembic_heads_prints():
    alembic = os.path.join(os.path.dirname(sys.executable), "alembic")
    with _temp_alembic_ini("sqlite:////tmp/gradebook.db") as ini:
        out = subprocess.run([alembic, "-c", ini, "heads"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert gradebook_schema_version() == out.stdout.split()[0]


def test_a_new_gradebook_is_stamped_with_it_and_no_process_is_started(tmp_path, monkeypatch):
    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"nbgrader started a process: {args}")

    monkeypatch.setattr(nbgrader.api.sp, "check_output", no_subprocess)
    cwd = os.getcwd()
    try:
        course = make_course(tmp_path / "course", ["01_dot_product_attention"])
        template = build_template(course, "01_dot_product_attention")
    finally:
        os.chdir(cwd)
    db = tmp_path / "gradebook.db"
    db.write_bytes(template.gradebook)
    with sqlite3.connect(db) as con:
        stamped = con.execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamped == [(gradebook_schema_version(),)]
