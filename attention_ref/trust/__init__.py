"""What decides a grade, and what protects it: the trust boundary of grading.

Everything between a student's code and a grade is in this package; nothing outside it
decides points. The exercises' checks (``attention_ref.checks``: the cases, the toolkit,
the models of the answers, the mistakes table) say *what* is right; this package makes
sure that a submission cannot change the answer, and shows what it wrote without running
it. Outside grading, the learner's self-check runs the checks in the learner's own kernel,
and of this package only :func:`.agent.graded` is asked (it says no).

Three processes, and who trusts whom::

    grader (nbgrader + attention_ref.course, trusted)
      |  stdin/stdout: one JSON order and one answer per line
      v
    checker (python -m attention_ref.trust.checker, trusted; no credentials)
      ^  one Unix socket, bound into the sandbox as /opt/checker.sock
      |  checker -> kernel: pickled (the kernel trusts the checker)
      |  kernel -> checker: data only (arrays, tensors, numbers, strings, handles)
    kernel (the student's notebook, in a bwrap sandbox; trusted by nobody)

What a graded notebook goes through, in order (nbgrader_config.py wires it up):

1. :mod:`.trusted` ``SourceTags``, the last sanitising preprocessor: every cell gets the
   tags of the instructor's cell it is (a ``training`` or ``skip-execution`` tag written
   into a submission changes nothing); nbgrader has put the test cells' source back.
2. :mod:`.secret`: the course's grading secret; the hidden checks' seeds derive from it in
   the checker, never in a notebook or a kernel.
3. :mod:`.trusted` ``CheckerProcess``: the grader starts the checker (:mod:`.checker`), one
   per grading process, and hands it the secret.
4. :mod:`.sandbox`: the kernel starts in a bubblewrap sandbox of its own (a private copy of
   the notebook, a read-only Python environment, the notebook's grading edition of the
   package from ``attention_ref.course.edition``, no network, capped memory, processes and
   disk); the checker's socket is its one way out.
5. The kernel's prelude (``attention_ref.course.cell_limits`` runs :mod:`.trusted`'s
   strings, before the learner's first cell): PyTorch's attention removed, its fused kernels
   and its Python (:mod:`.fused_removal`), the meta device warmed, new programs refused
   (:mod:`.no_exec`).
6. Each graded test cell: the grader tells the checker the cell and the checks its source
   makes (:func:`.trusted.expected_checks`). In the kernel, ``check(...)`` does not judge:
   :mod:`.agent` connects to the checker and serves it. The checker (:func:`.checker.judge`)
   runs the check on a stand-in for the learner's function or class (:mod:`.remote`), whose
   calls go to the kernel over :mod:`.wire` and run there under the per-call limit and the
   tripwire; a reference part the check puts in the learner's module has its calls computed
   back in the checker (:mod:`.computed`). A test cell of plain asserts runs in the checker
   (:mod:`.cell`); the kernel
   runs a stub that serves it. The checker keeps the verdicts in its own record.
7. After the cell, :func:`.trusted.apply_record` replaces its outputs with the checker's
   record (its feedback, and an error when not a pass), so nbgrader's scoring gives exactly
   the record's points; what the kernel printed is not kept.
8. :mod:`.inert` ``Inert``, the last autograde preprocessor, and again in formgrader's and
   the feedback's pages: outputs and written answers are shown, never run.

Around it, in ``attention_ref.course``: the repair of a notebook as JupyterLab writes it
(``repair``), the per-cell limits (``cell_limits``), the grading editions (``edition``),
the feedback that hides hidden tests (``feedback``) and the grading command (``grading``,
``cluster``, ``autograde``). docs/INSTRUCTOR_GUIDE.md, "Why you can trust a grade", says
it for instructors; tests/test_forgery.py and tests/test_sandbox.py attack it.

This package's ``__init__`` imports nothing: the kernel imports :mod:`.agent` alone, and the
grader's modules (:mod:`.trusted`, :mod:`.sandbox`, :mod:`.inert`, :mod:`.secret`) import no
PyTorch.
"""
