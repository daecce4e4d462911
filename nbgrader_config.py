"""nbgrader configuration for the course (used by `make release` and `make grade`).

Each notebook is its own assignment: solutions/NN_name/NN_name.ipynb is the source,
notebooks/NN_name/NN_name.ipynb the student release, submitted/<student>/NN_name/ the
submissions. See docs/INSTRUCTOR_GUIDE.md.
"""

import os

from nbgrader.converters import Autograde, GenerateFeedback
from nbgrader.preprocessors import Execute

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "attention-from-scratch"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# The gradebook: sqlite by default; a large course sets NBGRADER_DB_URL, e.g.
# postgresql+psycopg://grader:secret@dbhost/attention
c.CourseDirectory.db_url = os.environ.get(
    "NBGRADER_DB_URL", "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db")
)

# Grading runs students' code: every graded notebook runs in a sandbox of its own
# (attention_ref/trust/sandbox.py): it sees a read-only Python environment and the
# student edition of the package, a private copy of its notebook, no network, no
# credentials, with caps on memory, processes and bytes written (ATTENTION_REF_SANDBOX_*:
# docs/INSTRUCTOR_GUIDE.md). Where no sandbox can start, grading refuses;
# ATTENTION_REF_SANDBOX=off grades without one (trusted submissions only).
# Per-cell time limits, so that an infinite loop costs seconds, not the class: a cell
# tagged "training" gets NBGRADER_TRAINING_TIMEOUT (300 s), every other cell
# NBGRADER_CELL_TIMEOUT (30 s), and once a cell of a notebook timed out, every later cell
# of it at most NBGRADER_TIMEOUT_AFTER (10 s) (attention_ref/course/cell_limits.py).
# attention_ref.course and the grader's side of attention_ref.trust import no PyTorch
# (tests/test_package.py), so nbgrader's processes start quickly; imported once per process
# (not loaded again with each job's configuration), so that a grading worker keeps one
# trusted checker for all its jobs.
from attention_ref.course import cell_limits as _cell_limits  # noqa: E402
from attention_ref.course import feedback as _feedback  # noqa: E402
from attention_ref.course import formgrader as _formgrader  # noqa: E402
from attention_ref.course import repair as _repair  # noqa: E402
from attention_ref.course import students as _students  # noqa: E402
from attention_ref.trust import inert as _inert  # noqa: E402
from attention_ref.trust import sandbox as _sandbox  # noqa: E402
from attention_ref.trust import trusted as _trusted  # noqa: E402

# The verdict is decided outside the kernel: every graded test cell gets the points the
# trusted checker recorded for it (attention_ref/trust/trusted.py), never what the
# kernel printed; the tags of every cell are the instructor's.
_CourseExecute = _cell_limits.execute_preprocessor(
    _sandbox.kernel_manager_class() if _sandbox.enabled() else None,
    trusted=_trusted if _trusted.enabled() else None,
)
# A notebook as JupyterLab writes it (pasted images, copied or deleted cells, odd tags and
# ids, foreign nbgrader metadata) is repaired against the source before nbgrader reads it,
# the repairs listed in a last cell (attention_ref/course/repair.py).
c.Autograde.sanitize_preprocessors = [
    # First: nbconvert validates the notebook after every preprocessor, the first included.
    _repair.Repair,
    _students.CheckStudentId,  # a student id that is not one is not graded
    *Autograde.class_traits()["sanitize_preprocessors"].default(),
    _trusted.SourceTags,
]
c.SourceTags.source_root = os.path.join(c.CourseDirectory.root, "solutions")
# A test cell of plain asserts runs in the checker, with the imports of the instructor's cells.
c.CourseExecute.source_root = c.SourceTags.source_root
c.Autograde.autograde_preprocessors = [
    _CourseExecute if p is Execute else p
    for p in Autograde.class_traits()["autograde_preprocessors"].default()
] + [_inert.Inert]
# Nothing a submission wrote runs as script where it is shown: after the grades are saved,
# the graded notebook (which formgrader, the feedback and the class report read) keeps only
# inert outputs, and written answers have their HTML escaped (attention_ref/trust/inert.py);
# the HTML pages of formgrader and the feedback make it inert again as they render it (a
# notebook graded before this was done, or by another configuration).
c.HTMLExporter.preprocessors = [_inert.Inert]
# Every id that rendered markdown carries is prefixed ("md-"): a student's heading cannot
# take the id of an element of formgrader's page that its scripts look up.
c.HTMLExporter.filters = {"markdown2html": _inert.markdown2html}
# Formgrader (a Jupyter server extension that loads this file before it adds its pages):
# its pages escape what they print and allow only its own scripts, a student id that is
# not one is refused, files submitted beside a notebook are only downloads
# (attention_ref/course/formgrader.py).
_formgrader.harden()
# Feedback shows that hidden tests ran and their points, never their code; what hiding
# them changed is made inert again (before GetGrades adds the gradebook's scores).
c.GenerateFeedback.preprocessors = [
    _feedback.HideHiddenTests,
    _inert.Inert,
    *GenerateFeedback.class_traits()["preprocessors"].default(),
]
c.Execute.timeout = _cell_limits.CellLimits().cell  # the limit of cells outside autograde
c.Execute.interrupt_on_timeout = True
c.Execute.raise_on_iopub_timeout = False
# A test cell deleted or edited by a student is restored from the source at autograde.
c.OverwriteCells.add_missing_cells = True
# A cell that prints megabytes is cut down in the graded copy and the feedback.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# Student releases: no outputs, solutions replaced by a stub, hidden tests removed.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
c.ClearOutput.enabled = True
c.LockCells.lock_grade_cells = True
c.LockCells.lock_readonly_cells = True
