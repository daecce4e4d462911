"""nbgrader exchange hardening for a shared JupyterHub (instructor guide, "Running the
course on JupyterHub").

nbgrader's inbound folder is a drop box every student can write into. Its ``collect`` takes
each student's newest folder named ``STUDENT+ASSIGNMENT+TIMESTAMP+...``, and when the folder
is owned by another Unix account it only logs a warning (``CollectApp.check_owner``) and
collects it anyway: a student could replace a classmate's submission with a newer forged
one. ``OwnerCheckedCollect`` ignores every folder whose owner is not the student it names,
before choosing the newest. Enable it in the instructor's nbgrader_config.py::

    c.ExchangeFactory.collect = "attention_ref.course.exchange.OwnerCheckedCollect"
"""

from __future__ import annotations

import glob
import os
import pwd

from nbgrader.exchange.default.collect import ExchangeCollect


def _owner(path: str) -> str:
    try:
        return pwd.getpwuid(os.stat(path).st_uid).pw_name
    except KeyError:
        return "unknown id"


class OwnerCheckedCollect(ExchangeCollect):
    """``collect`` that skips submissions not owned by the student they claim to be from."""

    def init_src(self):
        super().init_src()
        student_id = self.coursedir.student_id or "*"
        pattern = os.path.join(self.inbound_path, f"{student_id}+{self.coursedir.assignment_id}+*")
        genuine, self.forged = [], []
        for path in glob.glob(pattern):
            rec = self._path_to_record(path)
            owner = _owner(path)
            if owner == rec["username"]:
                genuine.append(rec)
            else:
                self.forged.append((rec["filename"], owner))
                self.log.warning(
                    "Ignoring %s: it claims to be from %s but is owned by %s",
                    rec["filename"],
                    rec["username"],
                    owner,
                )
        by_user: dict[str, list[dict]] = {}
        for rec in genuine:
            by_user.setdefault(rec["username"], []).append(rec)
        self.src_records = []
        for recs in by_user.values():
            recs = self._sort_by_timestamp(recs)
            if self.duedate is not None and self.before_duedate:
                recs = [r for r in recs if r["timestamp"] <= self.duedate] or recs
            self.src_records.append(recs[0])
