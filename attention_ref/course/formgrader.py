"""Formgrader as the course runs it: nothing of a student's runs on the instructor's origin.

nbgrader's formgrader is a Jupyter server extension; its pages are served with the
instructor's credentials, where a script can read and write every file through
``/api/contents``. As nbgrader ships it (0.9):

- its Jinja pages (``manage_students/<id>``, ``gradebook/<assignment>``...) are rendered
  without escaping, and put the id of their URL into an inline script
  (``var student_id = "..."``): a link to ``manage_students/x"-alert(1)-"`` runs it;
- the submission page prints the student id (and names) unescaped;
- ``formgrader/submissions/<id>/<file>`` serves any file of the graded submission's folder,
  the files a student submitted beside the notebook included, as what its extension says
  (HTML, SVG) on the instructor's origin;
- no page carries a script policy.

:func:`harden` changes that, from nbgrader_config.py, which formgrader's extension loads
before it registers its handlers and templates: the Jinja pages escape what they print
(autoescape), the submission page gets its student's id and names escaped, a student id
that is not one (:mod:`attention_ref.course.students`) is answered 404, files beside the
notebook are sent only as downloads under a sandboxing policy, and every page of
formgrader carries a Content-Security-Policy whose ``script-src`` allows only formgrader's
own scripts: files from the server itself, and the inline scripts and event handlers of
formgrader's own templates by their hashes (none of the notebook's part of the page).

This module imports nothing of the course package but attention_ref.course.students, and
nbgrader (which any process that loads nbgrader_config.py has imported already).
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
import re

from . import students

#: The event handlers that formgrader's own templates write (``onclick="..."``), allowed
#: by their hashes (``'unsafe-hashes'``): the eye icons that show or hide a student's name.
TEMPLATE_HANDLERS = ("toggle_name(true);", "toggle_name(false);", "toggleAllNames()")
#: Where the notebook's part of the submission page starts, and the first thing after it.
NOTEBOOK_START = 'id="notebook-container"'
NOTEBOOK_END = '<div class="help">'
_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script\s*>", re.I | re.S)
_SRC = re.compile(r"""\bsrc\s*=\s*["']?([^"'\s>]+)""", re.I)
#: The policy of a file served from a submission's folder: nothing runs, nothing loads.
FILE_POLICY = "default-src 'none'; sandbox"


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _outside_notebook(page: str) -> str:
    """``page`` without the notebook's part of a submission page (what a submission wrote
    is shown there: nothing in it is allowed to run, whatever it holds)."""
    start = page.find(NOTEBOOK_START)
    end = page.rfind(NOTEBOOK_END)
    if start < 0 or end < start:
        return page
    return page[:start] + page[end:]


def script_policy(page: str) -> str:
    """The Content-Security-Policy of one of formgrader's HTML pages: scripts only from
    the server itself and from the exact places formgrader's own part of ``page`` loads
    them from (MathJax's folder), inline scripts and event handlers only those of its own
    part, by their hashes; no plugins, no ``<base>``, no form sent elsewhere. A page that
    loads MathJax 2 (the submission page) also allows ``eval``: MathJax runs the page's
    ``text/x-mathjax-config`` block with it (the math would show as TeX source without);
    no script element of a submission's reaches the page (attention_ref/trust/inert.py)."""
    own = _outside_notebook(page)
    sources = ["'self'"]
    for attrs, body in _SCRIPT.findall(own):
        src = _SRC.search(attrs)
        if src:
            url = html.unescape(src.group(1))
            if re.match(r"https://[^/\s]+/", url):
                folder = url.split("?", 1)[0].rsplit("/", 1)[0] + "/"
                if folder not in sources:
                    sources.append(folder)
        elif body.strip():
            sources.append(_hash(body))
    if any("mathjax" in src.lower() for src in sources[1:] if not src.startswith("'")):
        sources.append("'unsafe-eval'")  # MathJax 2 runs its configuration block with eval
    sources += ["'unsafe-hashes'", *(_hash(h) for h in TEMPLATE_HANDLERS)]
    return "; ".join(
        [
            "script-src " + " ".join(dict.fromkeys(sources)),
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'self'",
        ]
    )


def _is_page(chunk: object) -> bool:
    """Whether ``chunk`` (what a handler writes) is an HTML page of formgrader's."""
    if isinstance(chunk, bytes):
        chunk = chunk[:4000].decode("utf-8", "replace")
    head = chunk[:4000].lower() if isinstance(chunk, str) else ""
    return "<!doctype html" in head or "<html" in head


def harden() -> None:
    """Patch nbgrader's formgrader in this process (see the module's docstring); done
    once, and harmless where no Jupyter server runs."""
    from nbgrader.server_extensions.formgrader import base, formgrader, handlers

    if getattr(formgrader, "_attention_ref_hardened", False):
        return
    from jinja2 import Environment
    from tornado import web

    # Every HTML page gets its script policy, from the page itself.
    written = base.BaseHandler.write

    def write(self, chunk):
        if _is_page(chunk) and not isinstance(self, web.StaticFileHandler):
            page = chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk
            self.set_header("Content-Security-Policy", script_policy(page))
        return written(self, chunk)

    base.BaseHandler.write = write

    # The Jinja pages escape what they print.
    settings = formgrader.FormgradeExtension.init_tornado_settings

    def init_tornado_settings(self, webapp):
        settings(self, webapp)
        env = webapp.settings["nbgrader_jinja2_env"]
        webapp.settings["nbgrader_jinja2_env"] = Environment(loader=env.loader, autoescape=True)

    formgrader.FormgradeExtension.init_tornado_settings = init_tornado_settings

    class SubmissionHandler(handlers.SubmissionHandler):
        """The submission page, its student's id and names escaped."""

        @property
        def exporter(self):
            return _EscapingExporter(self.settings["nbgrader_exporter"])

    class SubmissionFilesHandler(handlers.SubmissionFilesHandler):
        """A file of the submission's folder: a download that runs nothing."""

        @property
        def content_security_policy(self) -> str:
            return FILE_POLICY

        def get_content_type(self) -> str:
            return "application/octet-stream"

        def set_extra_headers(self, path: str) -> None:
            name = os.path.basename(path).replace('"', "")
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')

    class ManageStudentsAssignmentsHandler(handlers.ManageStudentsAssignmentsHandler):
        def get(self, student_id):
            _check(student_id)
            return super().get(student_id)

    class ManageStudentNotebookSubmissionsHandler(handlers.ManageStudentNotebookSubmissionsHandler):
        def get(self, student_id, assignment_id):
            _check(student_id)
            return super().get(student_id, assignment_id)

    def _check(student_id: str) -> None:
        why = students.refusal(student_id)
        if why:
            raise web.HTTPError(404, why)

    replace = {
        handlers.SubmissionHandler: SubmissionHandler,
        handlers.SubmissionFilesHandler: SubmissionFilesHandler,
        handlers.ManageStudentsAssignmentsHandler: ManageStudentsAssignmentsHandler,
        handlers.ManageStudentNotebookSubmissionsHandler: ManageStudentNotebookSubmissionsHandler,
    }
    handlers.default_handlers[:] = [
        (rule[0], replace.get(rule[1], rule[1]), *rule[2:]) for rule in handlers.default_handlers
    ]
    formgrader._attention_ref_hardened = True


class _EscapingExporter:
    """formgrader's HTML exporter, given the submission's resources escaped: the student's
    id and names, which its template prints as they are."""

    ESCAPED = ("student", "first_name", "last_name", "notebook_path")

    def __init__(self, exporter):
        self.exporter = exporter

    def from_filename(self, filename, resources=None, **kw):
        resources = dict(resources or {})
        for key in self.ESCAPED:
            if isinstance(resources.get(key), str):
                resources[key] = html.escape(resources[key])
        return self.exporter.from_filename(filename, resources=resources, **kw)

    def __getattr__(self, name):
        return getattr(self.exporter, name)
