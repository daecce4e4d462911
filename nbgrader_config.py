"""nbgrader configuration for the course (used by `make release` and `make grade`).

Each notebook is its own assignment: solutions/NN_name/NN_name.ipynb is the source,
notebooks/NN_name/NN_name.ipynb the student release, submitted/<student>/NN_name/ the
submissions. See docs/INSTRUCTOR_GUIDE.md.
"""

import importlib.util
import os

from nbgrader.converters import Autograde
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

# Grading: per-cell time limits, so an infinite loop costs seconds, not the class. A cell
# tagged "training" gets NBGRADER_TRAINING_TIMEOUT (300 s), every other cell
# NBGRADER_CELL_TIMEOUT (30 s), and once a cell of a notebook timed out, every later cell
# of it at most NBGRADER_TIMEOUT_AFTER (10 s). attention_ref/cell_limits.py implements it;
# it is loaded by file path so that nbgrader does not import PyTorch with the package.
_spec = importlib.util.find_spec("attention_ref")
_limits_spec = importlib.util.spec_from_file_location(
    "attention_ref_cell_limits",
    os.path.join(os.path.dirname(_spec.origin), "cell_limits.py"),
)
_cell_limits = importlib.util.module_from_spec(_limits_spec)
_limits_spec.loader.exec_module(_cell_limits)
_CourseExecute = _cell_limits.execute_preprocessor()
c.Autograde.autograde_preprocessors = [
    _CourseExecute if p is Execute else p
    for p in Autograde.class_traits()["autograde_preprocessors"].default()
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
