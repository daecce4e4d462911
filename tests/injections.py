"""Script injections a submission can make in what grading shows (tests/test_inert.py,
tests/test_inert_views.py).

Each payload, were it to run, records its name in ``top.__pwned``, sets the page's title
to ``PWNED`` and requests ``/pwned-<name>``; a page in which none of that happened ran none
of them. The outputs are built here as data (for rendering them directly) and as the code
cells that display them (for a submission graded by `make grade`).
"""

# ruff: noqa: E501 - payloads are one line each

from __future__ import annotations

import json

import nbformat

#: What every payload's script does: no spaces, so that it fits an unquoted attribute.
RUN = (
    "(top.__pwned=top.__pwned||[]).push('{name}');top.document.title='PWNED';fetch('/pwned-{name}')"
)
MARKER = "student-text-7c41"  # text that must stay visible, next to each payload


def run(name: str) -> str:
    return RUN.format(name=name)


def _html(name: str, html: str) -> tuple[str, dict, dict]:
    return name, {"text/html": html, "text/plain": f"<{name}>"}, {}


def outputs() -> list[tuple[str, dict, dict]]:
    """``(name, mime bundle, metadata)`` of each display output that carries a payload."""
    return [
        _html("script-tag", f"<p>{MARKER}</p><script>{run('script-tag')}</script>"),
        _html("img-onerror", f'<img src=x onerror="{run("img-onerror")}">'),
        _html("svg-onload", f'<svg onload="{run("svg-onload")}"></svg>'),
        _html("svg-script", f"<svg><script>{run('svg-script')}</script></svg>"),
        _html(
            "iframe-srcdoc", f'<iframe srcdoc="<script>{run("iframe-srcdoc")}</script>"></iframe>'
        ),
        _html(
            "details-ontoggle", f'<details open ontoggle="{run("details-ontoggle")}">x</details>'
        ),
        _html("input-autofocus", f'<input autofocus onfocus="{run("input-autofocus")}">'),
        _html("object-data", f'<object data="javascript:{run("object-data")}"></object>'),
        _html("embed-src", f'<embed src="javascript:{run("embed-src")}">'),
        _html(
            "meta-refresh",
            f'<meta http-equiv="refresh" content="0;url=javascript:{run("meta-refresh")}">',
        ),
        _html(
            "javascript-link",
            f'<a id="js-link" href="javascript:{run("javascript-link")}">{MARKER} link</a>',
        ),
        _html("base-href", '<base href="http://127.0.0.1:9/">'),
        _html(
            "form-action",
            '<form action="/api/shutdown" method="post"><button id="form-button">go</button></form>',
        ),
        _html(
            "style-hides", "<style>body, #notebook, .container { display: none !important }</style>"
        ),
        (
            "application-javascript",
            {"application/javascript": run("application-javascript"), "text/plain": "<js>"},
            {},
        ),
        (
            "svg-output",
            {
                "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{run("svg-output")}"><script>{run("svg-output")}</script></svg>'
            },
            {},
        ),
        (
            "png-width",
            {"image/png": "x"},
            {"image/png": {"width": f"1 onerror={run('png-width')}"}},
        ),
        (
            "markdown-output",
            {"text/markdown": f'{MARKER} <img src=x onerror="{run("markdown-output")}">'},
            {},
        ),
        (
            "widget-view",
            {
                "application/vnd.jupyter.widget-view+json": {
                    "model_id": "x",
                    "version_major": 2,
                    "version_minor": 0,
                },
                "text/plain": "<widget>",
            },
            {},
        ),
    ]


#: A written answer (the notebook's manually graded markdown cell) with raw HTML.
ANSWER = (
    f"Scaling by 1/sqrt(d_k) keeps the logits' variance at 1. {MARKER}\n\n"
    f"<script>{run('answer-script')}</script>\n\n"
    f'<img src=x onerror="{run("answer-img")}">\n'
)
#: A markdown cell the student added: a javascript: link and an event handler.
ADDED_MARKDOWN = (
    f"{MARKER} [click me](javascript:{run('markdown-link')})\n\n"
    f'<details open ontoggle="{run("markdown-ontoggle")}">x</details>\n'
)
#: A raw cell the student added, marked as HTML.
RAW_HTML = f'<script>{run("raw-cell")}</script><img src=x onerror="{run("raw-img")}">'


#: A student's code cell holding its own hidden-test markers, and an HTML output built
#: around the line between them: were that line cut from the output (as the instructor's
#: hidden lines are), the ``title`` would close early and ``onerror`` be an attribute.
HIDDEN_LINE = "# student-chosen-line-7c41"
HIDDEN_MARKER_HTML = (
    f'<img src="data:image/gif;base64,R0lG" title="a\n{HIDDEN_LINE}">\n'
    f'q" onerror={run("hidden-marker")} b="\n<b title="">{MARKER}</b>'
)
HIDDEN_MARKER_CELL = (
    f"### BEGIN HIDDEN TESTS\n{HIDDEN_LINE}\n### END HIDDEN TESTS\n"
    "from IPython.display import publish_display_data\n"
    f"publish_display_data({{'text/html': {HIDDEN_MARKER_HTML!r}, 'text/plain': 'x'}})\n"
)


#: Headings whose anchor ids would be those of formgrader's own page: the score box of
#: the written answer ``why_sqrt_dk`` and the status line ``statusmessage``.
HEADINGS = (
    "# why_sqrt_dk\n\n## statusmessage\n\nSee [the heading above](#why_sqrt_dk) and "
    "[the paper](https://arxiv.org/abs/1706.03762).\n\n"
)
#: Links of every kind, in a markdown cell the student added: relative links that only
#: look absolute (to files beside the notebook), a link to formgrader's own reflected
#: page, ``javascript:`` and ``data:`` links, and an ordinary web link.
LINKS = (
    f"{MARKER} links: [my notes](http:notes.html), ![figure](http:figure.svg), "
    "[api](https:/api/contents), [relative](notes.html), [home](/tree), "
    "[reflected](/formgrader/manage_students/x%22-alert(1)-%22), "
    f"[js](javascript:{run('links-js')}), [data](data:text/html;base64,PHNjcmlwdD4=), "
    "[the paper](https://arxiv.org/abs/1706.03762), [mail](mailto:a@example.org), "
    "[top](#statusmessage)\n"
)
#: Files a student submits beside the notebook, which the links above open: an HTML page
#: and an SVG image whose scripts run (recorded as every payload's), then use the
#: instructor's API: read it (``/pwned-api-read`` requested if that worked), write a file.
API_SCRIPT = (
    "{run};var x=(document.cookie.match(/_xsrf=([^;]+)/)||[])[1]||'';"
    "fetch('/api/contents',{{headers:{{'X-XSRFToken':x}}}}).then(r=>{{if(r.ok){{"
    "fetch('/pwned-api-read')}}}});"
    "fetch('/api/contents/pwned-{name}.txt',{{method:'PUT',headers:{{'Content-Type':"
    "'application/json','X-XSRFToken':x}},body:JSON.stringify({{type:'file',format:'text',content:'x'}})}})"
)
BESIDE = {
    "notes.html": f"<html><body><p>{MARKER}</p><script>"
    + API_SCRIPT.format(run=run("beside-html"), name="beside-html")
    + "</script></body></html>",
    "figure.svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>'
    + API_SCRIPT.format(run=run("beside-svg"), name="beside-svg")
    + "</script></svg>",
}
#: A student id made of markup, as a folder of submitted/ can be named.
BAD_STUDENT = f's"><img src=x onerror={run("student-id")}>'
#: formgrader's page that put the id of its URL into an inline script, with a payload.
REFLECTED = 'manage_students/x"-' + run("reflected") + '-"'


def display_code(name: str, data: dict, metadata: dict) -> str:
    """A code cell that displays ``data`` as it is (``raw``), printing its name first."""
    return (
        "from IPython.display import publish_display_data\n"
        f"print({name!r})\n"
        f"publish_display_data({json.dumps(data)}, {json.dumps(metadata)})\n"
    )


def payload_cells() -> list:
    """Code cells that display every payload, then the added markdown and raw cells."""
    cells = [nbformat.v4.new_code_cell(display_code(*o)) for o in outputs()]
    cells.append(nbformat.v4.new_markdown_cell(ADDED_MARKDOWN))
    raw = nbformat.v4.new_raw_cell(RAW_HTML)
    raw.metadata["raw_mimetype"] = "text/html"
    cells.append(raw)
    return cells


def payload_notebook() -> nbformat.NotebookNode:
    """A notebook holding every payload as outputs already run (no kernel needed)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(ANSWER))
    for name, data, metadata in outputs():
        cell = nbformat.v4.new_code_cell(f"# {name}", execution_count=1)
        cell.outputs = [nbformat.v4.new_output("display_data", data=data, metadata=metadata)]
        cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=f"{MARKER}\n"))
        nb.cells.append(cell)
    nb.cells += payload_cells()[-2:]
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {},
            "version_major": 2,
            "version_minor": 0,
        }
    }
    return nb


#: JavaScript for Playwright: what the payloads left in the page.
PWNED = "() => ({pwned: window.__pwned || [], title: document.title})"
