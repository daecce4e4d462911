"""Nothing a submission wrote runs as script where grading shows it (COURSE_DESIGN.md
section 5; attention_ref/trust/inert.py).

A student submits notebook 01 solved, with every injection of tests/injections.py: code
cells that display each payload, a written answer and an added markdown cell with raw HTML
and a ``javascript:`` link, a raw HTML cell, and an exercise whose code raises an error
whose message is a script. It is graded with `make grade`'s code path, its feedback
generated with ``nbgrader generate_feedback`` and the class report made with
`make report`. Then, in Chromium: formgrader's view of the submission, served by a real
Jupyter server with nbgrader's formgrader (as the instructor sees it, with the server's
credentials in reach), the feedback HTML the student receives and the report are opened;
each page shows the student's text and none of the payloads ran (nothing recorded in the
page, its title unchanged, no request for ``/pwned-*``). A second student's graded
notebook holds the same payloads as they were (graded before this was in place):
formgrader makes it inert as it shows it; and formgrader over a copy of the course whose
configuration does not, runs them (the control: the test sees a payload that runs).

The same submission's written answer starts with headings named after formgrader's own
ids and its added cells hold links of every kind and a cell with its own hidden-test
markers; files are submitted beside it; a third student's id is made of markup. In
Chromium the instructor grades the written answer (the gradebook holds the points and
comment), and the submission page of that id, formgrader's page that reflected its URL
and the files beside the notebook run nothing (formgrader as nbgrader ships it, in the
control, runs each); every formgrader page carries a script policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from test_browser import ARTIFACTS, Lab, browser  # noqa: F401 - the Chromium fixture
from test_inert import scriptable

import injections
from course_tools import make_course, run_course, solution_path, test_cells
from test_class_grading import LIMITS
from test_grading import solved_submission, submit

pytestmark = pytest.mark.grading

AID = "01_dot_product_attention"
STUDENT = "xss"
CONTROL = "xss-control"  # in the gradebook, its graded notebook the payloads as they are
WRITTEN = "why_sqrt_dk"  # the notebook's written answer
RAISES = "sdpa"  # the exercise whose code raises a script as its error message
ERROR_SCRIPT = f"<script>{injections.run('error-message')}</script>"
#: A figure among the payloads: what a submission legitimately shows is kept.
FIGURE = (
    "import io\n\nimport matplotlib.pyplot as plt\nfrom IPython.display import Image, display\n\n"
    "fig = plt.figure(figsize=(3, 2))\nplt.plot([0, 1], [1, 0])\nbuf = io.BytesIO()\n"
    "fig.savefig(buf, format='png')\ndisplay(Image(buf.getvalue()))\n"
)


def xss_submission() -> nbformat.NotebookNode:
    nb = solved_submission(AID)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    cells[WRITTEN].source = injections.HEADINGS + injections.ANSWER
    cells[
        RAISES
    ].source = f"def {RAISES}(q, k, v, mask=None):\n    raise ValueError({ERROR_SCRIPT!r})\n"
    i = nb.cells.index(test_cells(nb)[0])
    nb.cells[i + 1 : i + 1] = [
        *injections.payload_cells(),
        nbformat.v4.new_code_cell(FIGURE),
        nbformat.v4.new_code_cell(injections.HIDDEN_MARKER_CELL),
        nbformat.v4.new_markdown_cell(injections.HEADINGS + injections.MARKER),
        nbformat.v4.new_markdown_cell(injections.LINKS),
    ]
    return nb


def nbgrader_cmd(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("NBGRADER_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        capture_output=True,
        text=True,
        env=env,
    )


def graded_path(course: Path, student: str) -> Path:
    return course / "autograded" / student / AID / f"{AID}.ipynb"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course with the xss student graded, its feedback generated and the report
    made; the control student added to the gradebook."""
    course = make_course(tmp_path_factory.mktemp("xss") / "course", [AID])
    submitted = xss_submission()
    submit(course, STUDENT, AID, submitted)
    for name, text in injections.BESIDE.items():  # files beside the notebook
        (course / "submitted" / STUDENT / AID / name).write_text(text)
    proc = run_course(course, "grade", env_extra=LIMITS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    feedback = nbgrader_cmd(course, "generate_feedback", AID, "--student", STUDENT)
    assert feedback.returncode == 0, feedback.stdout + feedback.stderr
    report = run_course(course, "report")
    assert report.returncode == 0, report.stdout + report.stderr
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_student(CONTROL)
        gb.add_submission(AID, CONTROL)
    control = graded_path(course, CONTROL)
    control.parent.mkdir(parents=True)
    nbformat.write(injections.payload_notebook(), control)
    feedback = nbgrader_cmd(course, "generate_feedback", AID, "--student", CONTROL)
    assert feedback.returncode == 0, feedback.stdout + feedback.stderr
    # A student id made of markup, in the gradebook from before ids were checked.
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_student(injections.BAD_STUDENT)
        gb.add_submission(AID, injections.BAD_STUDENT)
    bad = graded_path(course, injections.BAD_STUDENT)
    bad.parent.mkdir(parents=True)
    shutil.copy(graded_path(course, STUDENT), bad)
    for name, text in injections.BESIDE.items():  # as autograde copies them
        beside = graded_path(course, STUDENT).parent / name
        if not beside.exists():
            beside.write_text(text)
    return course, submitted


@contextlib.contextmanager
def jupyter(course: Path):
    """Jupyter (with nbgrader's formgrader) serving ``course`` on 127.0.0.1."""
    home = Path(tempfile.mkdtemp(prefix="xss-jupyter-"))
    lab = Lab(course, home)
    try:
        lab.wait_ready()
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def server(graded):
    """Formgrader over the graded course, as the instructor runs it."""
    with jupyter(graded[0]) as lab:
        yield lab


def test_the_graded_notebook_keeps_only_inert_outputs_and_escaped_answers(graded):
    course, submitted = graded
    nb = nbformat.read(graded_path(course, STUDENT), as_version=4)
    mimes = {m for c in nb.cells for o in c.get("outputs", []) for m in o.get("data", {})}
    assert mimes <= {"text/plain", "text/html", "text/markdown", "image/png"}, mimes
    assert "image/png" in mimes  # the notebook's figures are kept
    htmls = [
        o["data"]["text/html"]
        for c in nb.cells
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]
    assert len(htmls) >= 10 and not [h for h in htmls if scriptable(h)]
    printed = json.dumps([c.get("outputs", []) for c in nb.cells])
    for name, *_ in injections.outputs():  # every payload cell ran under grading
        assert name in printed, name
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == WRITTEN)
    assert "\\<script>" in answer.source and injections.MARKER in answer.source
    # The student's file is the same as submitted.
    assert nbformat.read(course / "submitted" / STUDENT / AID / f"{AID}.ipynb", 4) == submitted


def login(browser, server: Lab) -> None:  # noqa: F811
    """Log in as the instructor does, opening formgrader with the token: the server's
    login cookie then reaches its API from every page (opened first at a submission's
    URL, the cookie would be for that folder only)."""
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{server.port}/formgrader?token={server.token}")
    page.close()


def pwned_request(url: str) -> bool:
    """Whether ``url`` is what a payload requests when it runs (``/pwned-<name>``)."""
    return urllib.parse.urlparse(url).path.startswith("/pwned")


def open_page(browser, url: str):  # noqa: F811
    """Open ``url``, click every link (a payload may hide behind one) and return (what
    the payloads left, the requests for /pwned-*, dialogs, the page)."""
    page = browser.new_page()
    requests: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if pwned_request(r.url) else None)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(url, wait_until="load")
    for link in page.locator("#notebook a, body > a, .text_cell_render a").all():
        href = link.get_attribute("href") or ""
        if not href.startswith(("http", "#", "/")):
            link.evaluate("a => a.click()")
    page.wait_for_timeout(1500)
    return page.evaluate(injections.PWNED), requests, dialogs, page


def assert_nothing_ran(found, requests, dialogs, page):
    assert found["pwned"] == [], found
    assert found["title"] != "PWNED" and requests == [] and dialogs == []
    shown = page.get_by_text(injections.MARKER)
    assert shown.count() >= 3, "the student's text is not on the page"
    assert shown.first.is_visible()  # no style sheet of theirs hid it
    assert page.get_by_text(f"<script>{injections.run('answer-script')}").count() >= 1


def submission_id(course: Path, student: str) -> str:
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return gb.find_submission_notebook(AID, AID, student).id


def submission_url(server: Lab, course: Path, student: str) -> str:
    sid = submission_id(course, student)
    return f"http://127.0.0.1:{server.port}/formgrader/submissions/{sid}/?token={server.token}"


def reflected_url(server: Lab) -> str:
    """formgrader's page that reflects the student id of its URL, with a payload (its
    ``/`` written %2F, as a link in an answer can)."""
    path = urllib.parse.quote(injections.REFLECTED, safe="_")
    path = path.replace("manage_students%2F", "manage_students/", 1)
    return f"http://127.0.0.1:{server.port}/formgrader/{path}?token={server.token}"


def beside_url(server: Lab, course: Path, name: str) -> str:
    """Where formgrader serves a file submitted beside the notebook (a relative link in
    the submission's page, ``http:notes.html``, opens it)."""
    sid = submission_id(course, STUDENT)
    return (
        f"http://127.0.0.1:{server.port}/formgrader/submissions/{sid}/{name}?token={server.token}"
    )


def test_formgrader_shows_the_submission_and_runs_none_of_its_scripts(graded, server, browser):  # noqa: F811
    course, _ = graded
    found, requests, dialogs, page = open_page(browser, submission_url(server, course, STUDENT))
    # formgrader's own page: its score boxes for the written answer and the test cells.
    assert page.locator(f"input.score#{WRITTEN}").count() == 1, page.content()[:2000]
    assert_nothing_ran(found, requests, dialogs, page)
    assert page.get_by_text(ERROR_SCRIPT).count() >= 1  # the error's message, as text
    figures = page.eval_on_selector_all(
        "img[src^='data:image/png']", "els => els.map(e => e.complete && e.naturalWidth > 0)"
    )
    assert figures and all(figures), figures  # the student's figure is shown
    # The instructor's own markdown renders as written: its hints in <details>.
    source = nbformat.read(solution_path(AID), as_version=4)
    hints = sum(c.source.count("<summary>") for c in source.cells if c.cell_type == "markdown")
    assert hints and page.locator(".text_cell_render details > summary").count() == hints
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "formgrader-xss.png"), full_page=True)
    page.close()


def test_formgrader_makes_a_notebook_graded_without_inert_inert_as_it_shows_it(
    graded,
    server,
    browser,  # noqa: F811
):
    """A notebook graded before this was in place (or by another configuration): its
    outputs and markdown are the payloads as they were; formgrader's page runs none."""
    course, _ = graded
    found, requests, dialogs, page = open_page(browser, submission_url(server, course, CONTROL))
    assert_nothing_ran(found, requests, dialogs, page)
    page.close()


#: The line of nbgrader_config.py that has formgrader's page made inert as it renders,
#: the one that prefixes the ids of rendered markdown, and the one that hardens formgrader.
VIEW_TIME = "c.HTMLExporter.preprocessors = [_inert.Inert]\n"
IDS = 'c.HTMLExporter.filters = {"markdown2html": _inert.markdown2html}\n'
HARDEN = "_formgrader.harden()\n"


def test_formgrader_without_the_course_configuration_runs_the_payloads(
    graded,
    browser,  # noqa: F811
    tmp_path,
):
    """The control: formgrader over a copy of the course whose configuration lacks those
    lines (formgrader as nbgrader ships it) runs the payloads of the same notebook, the
    student id made of markup, the page that reflects its URL and the file beside the
    notebook; and the test sees each run."""
    course = tmp_path / "course"
    shutil.copytree(graded[0], course, ignore=shutil.ignore_patterns("feedback", "report"))
    config = (course / "nbgrader_config.py").read_text()
    assert VIEW_TIME in config and IDS in config and HARDEN in config
    for line in (VIEW_TIME, IDS, HARDEN):
        config = config.replace(line, "")
    (course / "nbgrader_config.py").write_text(config)
    with jupyter(course) as lab:
        found, requests, _, page = open_page(browser, submission_url(lab, course, CONTROL))
        ran = set(found["pwned"])
        page.close()
        found, _, _, page = open_page(browser, submission_url(lab, course, injections.BAD_STUDENT))
        bad_id = found["pwned"]
        page.close()
        found, _, _, page = open_page(browser, reflected_url(lab))
        reflected = found["pwned"]
        page.close()
        login(browser, lab)
        found, beside_requests, _, page = open_page(browser, beside_url(lab, course, "notes.html"))
        page.wait_for_function("() => (window.__pwned || []).length > 0", timeout=10_000)
        beside = page.evaluate(injections.PWNED)["pwned"]
        for _ in range(20):  # its requests to the API
            if (course / "pwned-beside-html.txt").exists():
                break
            page.wait_for_timeout(500)
        page.close()
    assert {"script-tag", "img-onerror", "application-javascript", "answer-script"} <= ran, ran
    assert any(f"/pwned-{name}" in u for u in requests for name in ran)
    assert "student-id" in bad_id and reflected == ["reflected"], (bad_id, reflected)
    assert beside == ["beside-html"]  # its script ran on the instructor's origin,
    assert any(u.endswith("/pwned-api-read") for u in beside_requests)  # read the API
    assert (course / "pwned-beside-html.txt").exists()  # and wrote a file through it


@pytest.mark.parametrize("student", [STUDENT, CONTROL])
def test_the_feedback_html_runs_none_of_the_submission_scripts(graded, browser, student):  # noqa: F811
    """The student's feedback, and that of a notebook graded without being made inert
    (the feedback makes it inert as it renders it)."""
    course, _ = graded
    path = course / "feedback" / student / AID / f"{AID}.html"
    text = path.read_text()
    assert not re.search(r"<script>\(top\.__pwned", text)
    found, requests, dialogs, page = open_page(browser, path.as_uri())
    assert_nothing_ran(found, requests, dialogs, page)
    assert page.get_by_text(re.compile(r"Score: [\d.]+ / [\d.]+")).count() >= 1  # feedback
    page.screenshot(path=str(ARTIFACTS / f"feedback-{student}.png"), full_page=True)
    page.close()


def test_the_class_report_shows_the_error_message_as_text(graded, browser):  # noqa: F811
    course, _ = graded
    path = course / "report" / "class" / "report.html"
    assert ERROR_SCRIPT not in path.read_text()
    page = browser.new_page()
    page.goto(path.as_uri())
    for summary in page.locator("summary").all():
        summary.click()
    page.wait_for_timeout(500)
    assert page.evaluate(injections.PWNED) == {"pwned": [], "title": "Class report"}
    assert page.get_by_text(re.compile(re.escape(ERROR_SCRIPT[:40]))).count() >= 1
    page.close()


# --------------------------------------------------------------------------- formgrader
def get(url: str):
    """``(status, headers, body)`` of a GET, whatever its status."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_the_instructor_grades_a_written_answer_in_chromium(graded, server, browser):  # noqa: F811
    """The written answer's markdown starts with headings named after formgrader's own
    ids (``# why_sqrt_dk``, ``## statusmessage``) and links of every kind; formgrader
    saves the points and comment typed for it, as the gradebook reads them back."""
    course, _ = graded
    login(browser, server)
    found, requests, dialogs, page = open_page(browser, submission_url(server, course, STUDENT))
    assert (
        page.locator("#why_sqrt_dk")
        .evaluate("e => e.tagName + '.' + e.className")
        .startswith("INPUT.score")
    )
    assert page.locator("#statusmessage").evaluate("e => e.parentElement.tagName") == "BODY"
    assert page.locator("h1#md-why_sqrt_dk").count() >= 1  # the heading, its id prefixed
    hrefs = page.eval_on_selector_all(
        "#notebook-container a[href]", "els => els.map(e => e.getAttribute('href'))"
    )
    assert "https://arxiv.org/abs/1706.03762" in hrefs  # a web link stays a link
    assert "#md-why_sqrt_dk" in hrefs  # and a link to the heading follows its id
    assert not [h for h in hrefs if not h.startswith(("https://", "http://", "mailto:", "#md-"))]
    assert not [h for h in hrefs if re.match(r"https?:(?!//)", h)], hrefs
    page.fill("input.score#why_sqrt_dk", "1.5")
    page.locator("input.score#why_sqrt_dk").press("Tab")
    page.fill("textarea#why_sqrt_dk-comment", "Right: the variance of q.k grows with d_k.")
    page.locator("textarea#why_sqrt_dk-comment").press("Tab")
    grade = comment = None
    for _ in range(60):  # saved by formgrader's scripts, through its API
        page.wait_for_timeout(500)
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            grade = gb.find_grade(WRITTEN, AID, AID, STUDENT).manual_score
            comment = gb.find_comment(WRITTEN, AID, AID, STUDENT).manual_comment
        if grade == 1.5 and comment:
            break
    assert grade == 1.5 and comment == "Right: the variance of q.k grows with d_k."
    assert page.evaluate(injections.PWNED)["pwned"] == [] and not requests and not dialogs
    page.screenshot(path=str(ARTIFACTS / "formgrader-graded.png"), full_page=True)
    page.close()


def test_formgrader_pages_allow_only_formgraders_own_scripts(graded, server):
    course, _ = graded
    pages = [
        submission_url(server, course, STUDENT),
        f"http://127.0.0.1:{server.port}/formgrader/manage_students?token={server.token}",
        f"http://127.0.0.1:{server.port}/formgrader/gradebook/{AID}/{AID}?token={server.token}",
    ]
    for url in pages:
        status, headers, body = get(url)
        assert status == 200, (url, status)
        policy = headers["Content-Security-Policy"]
        script_src = next(d for d in policy.split("; ") if d.startswith("script-src"))
        assert script_src.startswith("script-src 'self'") and "'unsafe-inline'" not in policy
        assert "object-src 'none'" in policy and "base-uri 'none'" in policy


def test_a_student_id_made_of_markup_runs_nothing_in_formgrader(graded, server, browser):  # noqa: F811
    course, _ = graded
    base = f"http://127.0.0.1:{server.port}/formgrader"
    for url in [
        submission_url(server, course, injections.BAD_STUDENT),
        f"{base}/manage_students?token={server.token}",
        f"{base}/gradebook/{AID}/{AID}?token={server.token}",
        reflected_url(server),
    ]:
        found, requests, dialogs, page = open_page(browser, url)
        page.wait_for_timeout(1000)  # the lists are filled by formgrader's scripts
        found = page.evaluate(injections.PWNED)
        assert found["pwned"] == [] and found["title"] != "PWNED", (url, found)
        assert requests == [] and dialogs == [], url
        page.close()
    status, _, body = get(reflected_url(server))
    assert status == 404 and b'"-(top' not in body  # refused, nothing of it unescaped
    status, _, body = get(submission_url(server, course, injections.BAD_STUDENT))
    assert status == 200 and b"(top.__pwned" in body  # shown, as text:
    assert b"<img src=x onerror" not in body and b"&lt;img src=x onerror" in body


def test_files_beside_the_notebook_are_downloads_that_run_nothing(graded, server, browser):  # noqa: F811
    course, _ = graded
    login(browser, server)
    for name in injections.BESIDE:
        status, headers, body = get(beside_url(server, course, name))
        assert status == 200 and body == injections.BESIDE[name].encode()
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["Content-Disposition"].startswith("attachment")
        assert "sandbox" in headers["Content-Security-Policy"]
        page = browser.new_page()
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if pwned_request(r.url) else None)
        page.goto(submission_url(server, course, STUDENT))
        with page.expect_download() as download:  # what a click on the link does
            page.evaluate("url => { location.href = url }", beside_url(server, course, name))
        assert download.value.suggested_filename == name
        page.wait_for_timeout(1000)
        assert page.evaluate(injections.PWNED)["pwned"] == [] and requests == []
        page.close()
    assert not list(course.glob("pwned-*")), "a file was written through the API"
