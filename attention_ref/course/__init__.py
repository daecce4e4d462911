"""The course's own tooling, apart from what the notebooks teach and from the checks.

    python -m attention_ref.course release [ASSIGNMENT ...]
        regenerate notebooks/NN_name/ (student versions) from solutions/ with nbgrader.
    python -m attention_ref.course grade [--jobs N] [--force] [--scheduler ADDRESS
            [--allow-plaintext-scheduler]] [ASSIGNMENT ...]
        autograde every submission under submitted/ into the gradebook, each in its own
        sandbox, N at a time (default: the number of cores) on a local Dask cluster, or on
        the Dask cluster of ADDRESS (tls://host:8786); report any submission whose
        kernel crashed, that hit a time limit or a resource cap; export grades.csv.
    python -m attention_ref.course report [--out DIR] [--names] [ASSIGNMENT ...]
        the class report, one folder per audience (DIR/README.txt says which is which):
        DIR/class/report.html and report.csv (per exercise, who passed, failed, hit a
        limit or did not attempt it, the named mistakes and the scores; no student named:
        safe to show the class), DIR/instructor/similarity.html and .csv (answers similar
        between submissions, a list to look at; with --names, the report naming each
        student too, never in class/), DIR/lms/canvas_grades.csv and moodle_grades.csv
        (the grades to import).
    python -m attention_ref.course similarity [--out DIR] [--names] [ASSIGNMENT ...]
        only the similar answers (DIR/instructor/), from submitted/ (no gradebook needed).

Run them from the course root (the folder with nbgrader_config.py). What decides or
protects a grade (the trusted checker, the sandbox, the source's tags, the grading secret,
what submissions show made inert) is not here but in :mod:`attention_ref.trust`, whose
docstring is its map. The modules here:

- ``plumbing``: the course root, its assignments, nbgrader's command line and API;
- ``release``: ``make release``;
- ``grading``: ``make grade``, the command (the submissions to grade, "not graded" left
  blank, grades.csv, the report of what went wrong);
- ``autograde``: one submission's grading (nbgrader's autograde, graded again when the
  grader failed, the salvage of a dead kernel), which ``grading`` and ``cluster`` both call;
- ``load``: how busy the machine is, and the waits of grading that stretch with it;
- ``repair``: a notebook as JupyterLab writes it, mended against the source before grading;
- ``students``: the pattern a student id must match (collect, grade, every autograde);
- ``formgrader``: formgrader hardened (escaped pages, no reflected ids, submitted files as
  sandboxed downloads, a script-src policy);
- ``cluster``: ``make grade``'s jobs on Dask (a local or a remote cluster; the command alone
  writes the gradebook);
- ``report``: ``make report`` (the class report, the Canvas and Moodle grade files);
- ``similarity``: answers similar between submissions (a page of ``make report``);
- ``anonymity``: what identifies a student, taken out of what the report and the list show;
- ``cell_limits``: the per-cell time limits of grading;
- ``feedback``: what a student's feedback shows (hidden tests' code never);
- ``exchange``: nbgrader's exchange as the course configures it on a JupyterHub;
- ``edition``: the student edition of the package (bytecode only), and each notebook's
  grading edition (no later notebook's answers; stand-ins from ``attention_ref._withheld``);
- ``authoring``: helpers that build solution notebooks with nbgrader's metadata.

None of these imports PyTorch (nor does ``import attention_ref``, which loads its references
on first use), so nbgrader_config.py imports them and nbgrader's processes start quickly.
"""
