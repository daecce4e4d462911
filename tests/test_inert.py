"""What a submission wrote is shown inert (attention_ref/trust/inert.py).

Unit tests of the sanitiser: each injection of tests/injections.py is removed or escaped,
while what a course's notebooks legitimately show (a PNG figure, plain text, a pandas-style
table, tqdm's progress text, code and math in a written answer, the instructor's own
markdown) is kept. Then the page that nbconvert renders from a notebook holding every
injection is opened in Chromium: as it is, the injections run (so the page detects them);
made inert, none runs and the student's text is shown.
"""

from __future__ import annotations

import base64
import copy
import io
import re
from html.parser import HTMLParser

import nbformat
import pytest
from test_browser import browser  # noqa: F401 - the headless Chromium fixture

from attention_ref.trust import inert

import injections
from course_tools import ROOT

ARTIFACTS = ROOT / "test-artifacts" / "inert"

# A DataFrame as pandas' _repr_html_ shows it.
DATAFRAME = """<div>
<style scoped>
    .dataframe tbody tr th:only-of-type { vertical-align: middle; }
</style>
<table border="1" class="dataframe">
  <thead>
    <tr style="text-align: right;"><th></th><th>loss</th></tr>
  </thead>
  <tbody>
    <tr><th>0</th><td>0.25</td></tr>
  </tbody>
</table>
</div>"""


class Tags(HTMLParser):
    """Every tag and attribute of an HTML text."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]


def scriptable(html: str) -> list[str]:
    """What in ``html`` could run script, load or submit anything, or restyle the page."""
    parsed = Tags(html)
    bad = [
        t
        for t in parsed.tags
        if t in {"script", "style", "iframe", "object", "embed", "meta", "base", "form", "svg"}
    ]
    for tag, name, value in parsed.attrs:
        if name.startswith("on") or re.match(r"\s*(javascript|vbscript|data:text)", value, re.I):
            bad.append(f"{tag} {name}={value}")
        if name in ("src", "srcdoc", "action", "formaction") and not value.startswith("data:image"):
            bad.append(f"{tag} {name}={value}")
    return bad


HTML_PAYLOADS = [(n, d) for n, d, _ in injections.outputs() if "text/html" in d]


@pytest.mark.parametrize(("name", "data"), HTML_PAYLOADS, ids=[n for n, _ in HTML_PAYLOADS])
def test_each_html_injection_is_removed_from_an_output(name, data):
    assert scriptable(data["text/html"]) or name == "javascript-link" or "href" in data["text/html"]
    cleaned = inert.inert_data(data)["text/html"]
    assert scriptable(cleaned) == [], cleaned
    assert "javascript:" not in cleaned and "onerror" not in cleaned
    assert "PWNED" not in cleaned  # a script's text is dropped with it, not shown


def test_script_bearing_output_types_are_removed_with_a_note():
    js = {"application/javascript": injections.run("js")}
    assert inert.inert_data(js) == {
        "text/plain": inert.REMOVED_NOTE.format(types="application/javascript")
    }
    widget = {
        "application/vnd.jupyter.widget-view+json": {"model_id": "1"},
        "text/plain": " 40%|####      | 4/10 [00:01<00:01]",
    }
    # tqdm's progress: the widget goes, its text stays as it was.
    assert inert.inert_data(widget) == {"text/plain": widget["text/plain"]}
    other = {"application/vnd.bokehjs_exec.v0+json": "", "text/vnd.mermaid": "graph TD;"}
    assert list(inert.inert_data(other)) == ["text/plain"]


def test_a_pandas_table_keeps_its_cells_and_alignment_but_not_its_style_sheet():
    assert "style" in Tags(DATAFRAME).tags  # what is cut is there to cut
    cleaned = inert.clean_html(DATAFRAME)
    parsed = Tags(cleaned)
    assert parsed.tags.count("td") == 1 and parsed.tags.count("th") == 3
    assert ("table", "border", "1") in parsed.attrs
    assert ("tr", "style", "text-align: right;") in parsed.attrs
    assert "style" not in parsed.tags and "vertical-align" not in cleaned
    assert ">0.25</td>" in cleaned and ">loss</th>" in cleaned


def figure_png() -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.imshow([[0, 1], [1, 0]])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def test_a_figure_and_plain_text_are_kept_as_they_are():
    data = {"image/png": figure_png(), "text/plain": "<Figure size 200x200 with 1 Axes>"}
    meta = {"image/png": {"width": 300, "height": 200}}
    out = nbformat.v4.new_output("display_data", data=copy.deepcopy(data), metadata=meta)
    inert.inert_output(out)
    assert out["data"] == data
    assert out["metadata"] == {"image/png": {"width": 300, "height": 200}}


def test_an_image_that_is_not_base64_or_has_a_size_that_is_not_a_number_is_cut():
    name, data, meta = next(o for o in injections.outputs() if o[0] == "png-width")
    out = nbformat.v4.new_output("display_data", data=dict(data), metadata=meta)
    inert.inert_output(out)
    assert out["data"] == {"text/plain": inert.REMOVED_NOTE.format(types="image/png")}
    assert out["metadata"] == {}


def test_a_matplotlib_svg_is_kept_and_a_scripted_svg_is_removed():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    assert inert.inert_data({"image/svg+xml": buf.getvalue()}) == {"image/svg+xml": buf.getvalue()}
    name, data, _ = next(o for o in injections.outputs() if o[0] == "svg-output")
    assert "image/svg+xml" not in inert.inert_data(data)
    for svg in [
        '<svg><a href="javascript:x()"><text>t</text></a></svg>',
        '<svg><image href="http://tracker.example/p.png"/></svg>',
        '<svg><set attributeName="onmouseover" to="x()"/></svg>',
        '<svg><rect style="fill: url(http://tracker.example/x)"/></svg>',
        "<svg><foreignObject><div>x</div></foreignObject></svg>",
    ]:
        assert not inert.svg_is_inert(svg), svg


def rendered(markdown: str) -> str:
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    return markdown2html_mistune(markdown)


def test_raw_html_in_a_written_answer_is_shown_as_text():
    out = rendered(inert.inert_markdown(injections.ANSWER))
    assert scriptable(out) == [] and "img" not in Tags(out).tags
    assert "&lt;script&gt;" in out and "&lt;img src=x onerror=" in out  # shown, as text
    assert injections.MARKER in out


def test_a_link_that_is_not_to_the_web_or_a_web_image_shows_the_markdown_as_text():
    for md in [
        injections.ADDED_MARKDOWN,
        "![x](https://tracker.example/p.png)",
        "[x](data:text/html;base64,PHNjcmlwdD4=)",
        "[x](/api/contents)",
        "[x][r]\n\n[r]: jAvAsCrIpT:x()",
    ]:
        out = rendered(inert.inert_markdown(md))
        assert not [a for a in Tags(out).attrs if a[1] in ("href", "src", "ontoggle")], out
    as_text = inert.inert_markdown(injections.ADDED_MARKDOWN)
    assert as_text.startswith(inert.AS_TEXT_NOTE) and injections.ADDED_MARKDOWN.strip() in as_text


def test_code_math_tables_and_links_in_an_answer_are_left_as_written():
    answer = (
        "# Why\n\nQuery `i` sees key `j <= i`; weights are $w_{ij} < 1$ and\n\n"
        "$$\\sum_j w_{ij} = 1$$\n\n| n | time |\n|--:|:--|\n| 1 | 2 s |\n\n"
        "See [the paper](https://arxiv.org/abs/1706.03762).\n\n```python\nx = a < b\n```\n"
    )
    assert inert.inert_markdown(answer) == answer


def test_mathjax_commands_that_link_or_load_code_are_broken_up():
    tex = r"$\href{javascript:x()}{y}$ and $\require{action}$ but $\frac{1}{\sqrt{d_k}}$"
    out = inert.defuse_tex(tex)
    assert r"\\href" in out and r"\\require" in out and r"\frac{1}{\sqrt{d_k}}" in out
    assert not re.search(r"(?<!\\)\\(href|require)", out)
    assert inert.defuse_tex(out) == out


def test_the_instructors_markdown_is_kept_and_an_edited_copy_is_escaped():
    hint = "Hint:\n<details><summary>show</summary>use `keepdims=True`</details>"
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(hint), nbformat.v4.new_markdown_cell(hint + " ")]
    )
    inert.make_inert(nb, frozenset({hint}))
    assert nb.cells[0].source == hint
    assert "\\<details>" in nb.cells[1].source


def test_html_that_could_cover_the_page_loses_its_classes_and_layout():
    html = (
        '<div class="navbar navbar-fixed-top modal" style="position: fixed; top: 0; '
        'width: 100%; height: 100%; margin: -900px; color: red">fake grade: 10/10</div>'
    )
    cleaned = inert.clean_html(html)
    assert Tags(cleaned).attrs == [("div", "style", "color: red;")], cleaned
    assert "fake grade: 10/10" in cleaned


def test_metadata_that_templates_write_into_the_page_is_cut():
    nb = injections.payload_notebook()
    cell = nb.cells[1]
    cell.metadata["nbgrader"] = {"grade_id": "x", "grade": False, "comment": "<script>", "score": 9}
    cell["execution_count"] = "<script>"
    md = nb.cells[0]
    md["attachments"] = {
        "a.png": {"image/png": figure_png()},
        "b.svg": {"image/svg+xml": "<svg onload='x()'/>"},
        "c.png": {"image/png": 'x" onerror="x()'},
    }
    inert.make_inert(nb)
    assert "widgets" not in nb.metadata
    assert cell.metadata["nbgrader"] == {"grade_id": "x", "grade": False}
    assert cell.execution_count is None
    assert list(md.attachments) == ["a.png", "b.svg", "c.png"]
    assert [list(b) for b in md.attachments.values()] == [["image/png"], [], []]


def test_making_a_notebook_inert_twice_changes_nothing_more():
    once = inert.make_inert(injections.payload_notebook())
    twice = inert.make_inert(copy.deepcopy(once))
    assert twice == once


def render(nb) -> str:
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter(template_name="classic").from_notebook_node(nb)
    return html


def open_and_poke(browser, path):  # noqa: F811
    """Open ``path`` in Chromium, click the links a payload hides behind, and return
    (what the payloads left, the requests for /pwned-*, the page)."""
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "pwned" in r.url else None)
    page.on("dialog", lambda d: d.dismiss())
    # The classic template loads jQuery from a CDN, out of reach offline: a stand-in, so
    # that a javascript output gets as far as it would where the CDN is reached.
    page.add_init_script("window.$ = window.jQuery = () => null")
    page.goto(path.as_uri())
    for link in page.locator("a", has_text=re.compile("click me|link")).all():
        link.evaluate("a => a.click()")  # also where a style sheet hid it
    page.wait_for_timeout(1000)
    return page.evaluate(injections.PWNED), requests, page


#: Payloads that run in Chromium from nbconvert's page when nothing is made inert (the
#: control: it proves the page detects what runs).
LIVE = {
    "script-tag",
    "img-onerror",
    "svg-onload",
    "svg-script",
    "iframe-srcdoc",
    "details-ontoggle",
    "application-javascript",
    "png-width",
    "markdown-output",
    "javascript-link",
    "answer-script",
    "answer-img",
    "markdown-link",
    "markdown-ontoggle",
}


def test_a_page_with_every_injection_runs_none_of_them_once_inert(browser, tmp_path):  # noqa: F811
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    raw = tmp_path / "raw.html"
    raw.write_text(render(injections.payload_notebook()))
    found, requests, page = open_and_poke(browser, raw)
    assert set(found["pwned"]) >= LIVE, sorted(LIVE - set(found["pwned"]))
    assert found["title"] == "PWNED" and requests
    page.close()

    made_inert = tmp_path / "inert.html"
    made_inert.write_text(render(inert.make_inert(injections.payload_notebook())))
    found, requests, page = open_and_poke(browser, made_inert)
    assert found == {"pwned": [], "title": "Notebook"} and requests == []
    shown = page.get_by_text(injections.MARKER)
    assert shown.count() >= len(injections.outputs()) and shown.first.is_visible()
    assert page.get_by_text("<script>(top.__pwned").count() >= 1  # the answer, as text
    page.screenshot(path=str(ARTIFACTS / "inert-page.png"), full_page=True)
    page.close()


@pytest.mark.parametrize("style", ["nbgrader", "formgrader"])
def test_the_preprocessor_trusts_the_markdown_of_the_assignments_source(tmp_path, style):
    """nbgrader's converters name the notebook in resources["nbgrader"], formgrader's page
    in resources itself; either way the source's markdown is kept as written."""
    from traitlets.config import Config

    hint = "<details><summary>Hint</summary>`x.max(axis, keepdims=True)`</details>"
    source = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(hint)])
    (tmp_path / "solutions" / "a1").mkdir(parents=True)
    nbformat.write(source, tmp_path / "solutions" / "a1" / "nb.ipynb")
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    config.CourseDirectory.source_directory = "solutions"
    graded = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(hint), nbformat.v4.new_markdown_cell(f"x {hint}")]
    )
    names = {"assignment": "a1", "notebook": "nb"}
    resources = (
        {"nbgrader": names} if style == "nbgrader" else {"assignment_id": "a1", "notebook_id": "nb"}
    )
    nb, _ = inert.Inert(config=config).preprocess(graded, resources)
    assert nb.cells[0].source == hint
    assert nb.cells[1].source.startswith("x \\<details>")
    untrusted, _ = inert.Inert(config=config).preprocess(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(hint)]), {}
    )
    assert untrusted.cells[0].source.startswith("\\<details>")


def test_the_course_config_makes_notebooks_inert_after_grading_and_in_its_pages():
    """nbgrader_config.py: Inert is the last autograde preprocessor (after the grades are
    saved) and the preprocessor of the HTML pages (formgrader's, the feedback's), loaded
    without importing PyTorch into nbgrader."""
    import ast
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from traitlets.config.loader import PyFileConfigLoader\n"
        f"c = PyFileConfigLoader('nbgrader_config.py', path={str(ROOT)!r}).load_config()\n"
        "print([p.__name__ for p in c.Autograde.autograde_preprocessors])\n"
        "print([p.__name__ for p in c.HTMLExporter.preprocessors])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    autograde = ast.literal_eval(out[0])
    assert autograde[-1] == "Inert" and autograde.index("SaveAutoGrades") < len(autograde) - 1
    assert out[1] == "['Inert']" and out[2] == "False", out


# --------------------------------------------------------------------------- the feedback
def course_config():
    """The course's nbgrader_config.py, loaded."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()


def feedback_exporter():
    """The HTML exporter as ``nbgrader generate_feedback`` builds it from the course's
    nbgrader_config.py (its own preprocessors, then the converter's, in order; GetGrades,
    which needs a gradebook, left out)."""
    from nbconvert import HTMLExporter

    config = course_config()
    exporter = HTMLExporter(config=config, template_name="classic")
    for pp in config.GenerateFeedback.preprocessors:
        if pp.__name__ != "GetGrades":
            exporter.register_preprocessor(pp, enabled=True)
    return exporter


def test_a_students_own_hidden_test_markers_cut_nothing_from_the_feedback():
    """A student's cell with its own ``### BEGIN HIDDEN TESTS`` line and an HTML output
    built around it: hiding hidden tests cuts nothing of it (markers count only in the
    instructor's test cells), and the page is made inert after hiding them."""
    student = nbformat.v4.new_code_cell(injections.HIDDEN_MARKER_CELL, execution_count=1)
    student.outputs = [
        nbformat.v4.new_output(
            "display_data", data={"text/html": injections.HIDDEN_MARKER_HTML, "text/plain": "x"}
        )
    ]
    student.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "sdpa"}
    hidden = "assert instructor_only_check(sdpa) == 42\n"
    test = nbformat.v4.new_code_cell(
        f"assert True\n### BEGIN HIDDEN TESTS\n{hidden}### END HIDDEN TESTS\n", execution_count=2
    )
    test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1}
    nb = inert.make_inert(nbformat.v4.new_notebook(cells=[student, test]))
    assert not scriptable(nb.cells[0].outputs[0].data["text/html"])  # inert as graded
    html, _ = feedback_exporter().from_notebook_node(nb, resources={})
    handlers = [a for a in Tags(html).attrs if a[1].startswith("on")]
    assert handlers == [], handlers
    # The student's cell is shown as written, the instructor's hidden test is not.
    assert injections.HIDDEN_LINE in html and injections.MARKER in html
    assert "instructor_only_check" not in html and "hidden tests ran here" in html
    names = [p.__name__ for p in course_config().GenerateFeedback.preprocessors]
    assert names.index("Inert") == names.index("HideHiddenTests") + 1, names


# --------------------------------------------------------------------------- ids and links
#: Headings whose ids are those of formgrader's page: the score box of the written answer
#: (its grade id) and the status line its scripts write to.
CLOBBERING = "# why_sqrt_dk\n\n## statusmessage\n\nSee [above](#why_sqrt_dk).\n"


def page_ids(html: str) -> list[str]:
    return [v for _, name, v in Tags(html).attrs if name in ("id", "name")]


def test_ids_that_markdown_makes_are_prefixed_in_the_course_pages():
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(CLOBBERING)])
    html, _ = HTMLExporter(config=course_config(), template_name="classic").from_notebook_node(nb)
    ids = page_ids(html)
    assert "md-why_sqrt_dk" in ids and "md-statusmessage" in ids, ids
    assert not {"why_sqrt_dk", "statusmessage"} & set(ids), ids
    links = [v for tag, name, v in Tags(html).attrs if tag == "a" and name == "href"]
    assert "#md-why_sqrt_dk" in links and "#why_sqrt_dk" not in links, links  # still link


def test_prefix_ids_reads_attributes_whole():
    html = (
        '<a name=a id=\'b\' href="#c" title="x id=y" data-id="z">t</a> id="text"'
        '<a href="https://x.org/#y">w</a>'
    )
    out = inert.prefix_ids(html)
    assert page_ids(out) == ["md-a", "md-b"], out
    assert 'href="#md-c"' in out and 'title="x id=y"' in out and 'data-id="z"' in out
    assert 'id="text"' in out and 'href="https://x.org/#y"' in out  # text, other pages


#: Links that only look absolute: ``http:notes.html`` is relative (to a file the student
#: submitted beside the notebook, served by formgrader on the instructor's origin).
RELATIVE = ["http:notes.html", "http:figure.svg", "https:/api/contents", "HTTP:x.html", "http:"]


@pytest.mark.parametrize("url", RELATIVE)
def test_a_link_is_a_link_only_when_absolute(url):
    for md in [f"see [my notes]({url})", f"![figure]({url})", f"<{url}>"]:
        out = rendered(inert.inert_markdown(md))
        assert not [a for a in Tags(out).attrs if a[1] in ("href", "src")], out
    cleaned = inert.clean_html(f'<a href="{url}">notes</a>')
    assert "href" not in cleaned and "notes" in cleaned
    kept = "see [the paper](https://arxiv.org/abs/1706.03762)"
    assert inert.inert_markdown(kept) == kept


# --------------------------------------------------------------------------- formgrader's page
def test_formgraders_script_policy_allows_its_own_scripts_and_none_of_the_notebooks():
    """The policy of formgrader's submission page, rendered by its own template: the
    hashes of the template's inline scripts, never of a script in the notebook's part
    (here a notebook not made inert, which holds some)."""
    import hashlib

    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers

    from attention_ref.course import formgrader

    config = course_config()
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    config.HTMLExporter.preprocessors = []  # the payloads as they are
    resources = {
        "assignment_id": "a1",
        "notebook_id": "nb",
        "submission_id": "s1",
        "index": 0,
        "total": 1,
        "base_url": "",
        "student": "s0042",
        "first_name": "",
        "last_name": "",
        "notebook_path": "autograded/s0042/a1/nb.ipynb",
    }
    page, _ = HTMLExporter(config=config).from_notebook_node(
        injections.payload_notebook(), resources=resources
    )
    policy = formgrader.script_policy(page)
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, re.S)
    inline = [body for attrs, body in scripts if "src=" not in attrs and body.strip()]

    def digest(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    allowed = [b for b in inline if digest(b) in policy]
    assert any("var submission_id" in b for b in allowed)  # the template's
    assert any("toggle_name" in b for b in allowed)
    student = [b for b in inline if "__pwned" in b]
    assert student and not [b for b in student if digest(b) in policy], policy
    assert policy.startswith("script-src 'self' ") and "'unsafe-inline'" not in policy
    assert digest("toggle_name(true);") in policy and "'unsafe-hashes'" in policy
