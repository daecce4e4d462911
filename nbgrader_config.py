"""nbgrader configuration for the course (used by `make release` and `make grade`).

Each notebook is its own assignment: solutions/NN_name/NN_name.ipynb is the source,
notebooks/NN_name/NN_name.ipynb the student release, submitted/<student>/NN_name/ the
submissions. See docs/INSTRUCTOR_GUIDE.md.
"""

import os

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

# Grading: a per-cell time limit, so an infinite loop costs one cell, not the class.
c.Execute.timeout = int(os.environ.get("NBGRADER_CELL_TIMEOUT", "300"))
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
