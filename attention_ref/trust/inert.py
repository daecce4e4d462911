"""What a submission wrote is shown, never run: outputs and written answers made inert.

Formgrader shows a submission as HTML served by the instructor's own Jupyter server, and
the feedback is HTML that students open; both are rendered by nbconvert from the graded
notebook, which passes outputs and markdown through as HTML. A submission that prints a
``<script>``, an ``onerror`` attribute or an ``application/javascript`` output, or that
writes one in a markdown cell, would run it there (in formgrader with the instructor's
credentials). :class:`Inert` makes a notebook inert:

- **outputs** keep only what renders without script: plain text, errors and streams
  (nbconvert escapes them), PNG/JPEG/GIF images whose data is base64, ``text/html``
  cleaned by an allowlist (:func:`clean_html`: tables, text formatting, links to http(s)
  and images embedded as data; no ``<script>``, ``<style>``, ``<iframe>``, forms, event
  handlers or ``javascript:`` URLs), SVG only when it holds nothing that could run or
  load (:func:`svg_is_inert`), ``text/markdown`` and ``text/latex`` as written answers
  are. Everything else (JavaScript, widget views, other rich outputs) is removed; a
  display left with nothing says so in plain text. Output metadata keeps only numeric
  image sizes (templates write them into attributes unquoted);
- **markdown** that the instructor's source notebook does not hold word for word (a
  written answer, a cell a student added or edited) has its raw HTML escaped, shown as
  text (:func:`inert_markdown`); what still renders to anything but plain markdown (a
  ``javascript:`` link, an image from the web) is shown whole as a code block. TeX
  commands that make links or load code in MathJax (``\\href``, ``\\require``...) are
  broken up;
- **metadata** that templates write into the page: the notebook's widget state, cell
  attachments other than base64 images, execution counts that are not numbers, and the
  ``comment``/``score`` that only the gradebook may set.

It runs last among the autograde preprocessors (nbgrader_config.py), after the grades are
saved, so the graded notebook that formgrader, the feedback and the class report read is
inert; and again in the HTML exporter that renders formgrader's page and the feedback, for
a notebook graded before it was in place or by another configuration.

This module imports nothing from the course package (nbgrader_config.py loads it by path)
and nothing heavier than bleach and nbconvert.
"""

from __future__ import annotations

import base64
import binascii
import re
from html.parser import HTMLParser
from pathlib import Path

import bleach
from bleach.css_sanitizer import CSSSanitizer
from jinja2 import pass_context
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

#: Output types kept (after cleaning); every other one is removed.
IMAGES = ("image/png", "image/jpeg", "image/gif")
KEPT = {"text/plain", "text/html", "text/markdown", "text/latex", "image/svg+xml", *IMAGES}
REMOVED_NOTE = "[output not shown in grading views: {types}]"
AS_TEXT_NOTE = (
    "_[Shown as plain text: it holds HTML, links or images that grading views do not render.]_\n\n"
)

# --------------------------------------------------------------------------- HTML outputs
# fmt: off
HTML_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4", "h5",
    "h6", "hr", "i", "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp",
    "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th",
    "thead", "tr", "tt", "u", "ul", "var",
})
# fmt: on
HTML_ATTRIBUTES = {
    "*": ["title", "align", "style"],  # no class: the page's own classes (a fixed navbar)
    "a": ["href"],
    "img": ["src", "alt", "width", "height"],
    "table": ["border", "cellpadding", "cellspacing"],
    "td": ["colspan", "rowspan", "valign"],
    "th": ["colspan", "rowspan", "valign"],
    "col": ["span", "width"],
    "ol": ["start", "type"],
}
#: CSS properties kept in style attributes (pandas' tables use a few): colour and text,
#: nothing that sizes, moves or lays out (an output could cover the grading form).
# fmt: off
CSS_PROPERTIES = frozenset({
    "color", "background-color", "text-align", "vertical-align", "font-weight", "font-style",
    "white-space", "border", "border-collapse", "text-decoration",
})
# fmt: on
#: Elements whose content is dropped with them (their text means nothing as text).
DROPPED_WITH_CONTENT = re.compile(
    r"<(script|style|template|noscript|iframe|object|embed|svg|math)\b.*?(</\1\s*>|\Z)",
    re.I | re.S,
)
DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*\Z", re.I)
#: An image a markdown cell carries (nbconvert embeds it from the cell's attachments).
ATTACHMENT = re.compile(r"attachment:[\w.-]+\Z")
#: A link that may stay a link: an absolute web address, mail, or a place in the page.
#: ``http:notes.html`` (no ``//``) is a relative link, to a file beside the notebook on
#: the instructor's own server: it is not one.
WEB_LINK = re.compile(r"(https?://[^/\\\s]|mailto:|#)", re.I)


def _attribute_allowed(tag: str, name: str, value: str) -> bool:
    if name in HTML_ATTRIBUTES.get(tag, ()) or name in HTML_ATTRIBUTES["*"]:
        if name == "href":
            return bool(WEB_LINK.match(value.strip()))
        if name == "src":
            return bool(DATA_IMAGE.match(value.strip()))
        return True
    return False


_CLEANER = bleach.sanitizer.Cleaner(
    tags=HTML_TAGS,
    attributes=_attribute_allowed,
    protocols={"http", "https", "mailto", "data"},
    strip=True,
    strip_comments=True,
    css_sanitizer=CSSSanitizer(allowed_css_properties=CSS_PROPERTIES),
)


def clean_html(html: str) -> str:
    """``html`` with only the tags, attributes and URLs of the allowlist above: no
    script, no event handler, no frame, form, style sheet or ``javascript:`` URL; images
    only as embedded data; TeX link commands broken up (:func:`defuse_tex`)."""
    return defuse_tex(_CLEANER.clean(DROPPED_WITH_CONTENT.sub("", html)))


# --------------------------------------------------------------------------- TeX (MathJax)
#: MathJax commands that make a link, set attributes or load code.
TEX_COMMANDS = re.compile(
    r"(?<!\\)((?:\\\\)*)\\(href|url|class|cssId|style|html|unicode|require|csname|def|let"
    r"|newcommand|renewcommand|DeclareMathOperator)(?![A-Za-z])"
)


def defuse_tex(text: str) -> str:
    """``text`` with each MathJax command that can link, style or load code written as
    a line break and a word (``\\\\href``), which MathJax shows and never runs."""
    return TEX_COMMANDS.sub(lambda m: m.group(1) + "\\\\" + m.group(2), text)


# --------------------------------------------------------------------------- SVG
SVG_RISKS = re.compile(
    r"<\s*/?\s*(script|foreignObject|iframe|embed|object|handler|listener|set|animate\w*"
    r"|image|a|feImage)\b"  # elements that run, load or link
    r"|\bon[a-z]+\s*="  # event handlers
    r"|(java|vb)script\s*:|data\s*:|<!ENTITY|&#|@import|<\?xml-stylesheet"
    r"|url\(\s*['\"]?(?!#)"  # url() to anything but the document's own ids
    r"|href\s*=\s*(?![\"']#)",  # links but to the document's own ids (matplotlib's <use>)
    re.I,
)


def svg_is_inert(svg: str) -> bool:
    """Whether ``svg`` holds nothing that could run script, link or load anything (a
    conservative test: a matplotlib figure passes; when unsure, the SVG is removed)."""
    return SVG_RISKS.search(svg) is None


# --------------------------------------------------------------------------- markdown
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN_OR_MATH = re.compile(r"(`+).*?(?<!`)\1(?!`)|\$\$.+?\$\$|\$[^$\n]+\$", re.S)
UNESCAPED_LT = re.compile(r"(?<!\\)((?:\\\\)*)<")


def _escape_lt(text: str) -> str:
    return UNESCAPED_LT.sub(lambda m: m.group(1) + "\\<", text)


def _escape_outside_code(text: str) -> str:
    """Backslash-escape each ``<`` of ``text`` outside code spans and math (which the
    markdown renderer escapes itself)."""
    out, pos = [], 0
    for m in CODE_SPAN_OR_MATH.finditer(text):
        out += [_escape_lt(text[pos : m.start()]), m.group(0)]
        pos = m.end()
    return "".join([*out, _escape_lt(text[pos:])])


def escape_raw_html(source: str) -> str:
    """Markdown ``source`` with its raw HTML escaped (``\\<``), so that it renders as the
    text it is; fenced code, code spans and math are left alone."""
    lines, out, fence, chunk = source.splitlines(keepends=True), [], "", []
    for line in lines:
        m = FENCE.match(line)
        if fence:
            out.append(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
        elif m:
            out.append(_escape_outside_code("".join(chunk)))
            chunk, fence = [], m.group(1)
            out.append(line)
        else:
            chunk.append(line)
    out.append(_escape_outside_code("".join(chunk)))
    return "".join(out)


#: What plain markdown renders to, and the attributes the renderer gives it.
# fmt: off
MARKDOWN_TAGS = frozenset({
    "a", "blockquote", "br", "code", "del", "div", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "img", "li", "ol", "p", "pre", "span", "strong", "table", "tbody", "td", "th",
    "thead", "tr", "ul",
})
# fmt: on
MARKDOWN_ATTRIBUTES = {"href", "src", "alt", "title", "class", "id", "start", "style"}
TEXT_ALIGN = re.compile(r"text-align:\s*(left|right|center);?\Z")


class _Audit(HTMLParser):
    """Finds the first thing in rendered markdown that plain markdown would not make."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problem = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in MARKDOWN_TAGS:
            self.problem = self.problem or f"<{tag}>"
        for name, value in attrs:
            value = (value or "").strip()
            bad = (
                name not in MARKDOWN_ATTRIBUTES
                or (name == "href" and not WEB_LINK.match(value))
                or (name == "src" and not (DATA_IMAGE.match(value) or ATTACHMENT.match(value)))
                or (name == "style" and not TEXT_ALIGN.match(value))
            )
            if bad:
                self.problem = self.problem or f"<{tag} {name}={value[:40]!r}>"

    handle_startendtag = handle_starttag

    def handle_comment(self, data: str) -> None:
        self.problem = self.problem or "<!-- -->"

    def handle_decl(self, decl: str) -> None:
        self.problem = self.problem or "<!...>"

    def handle_pi(self, data: str) -> None:
        self.problem = self.problem or "<?...>"


def render_problem(markdown: str) -> str:
    """What in ``markdown``, rendered as formgrader and the feedback render it, is more
    than plain markdown ("" if nothing is)."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune  # noqa: PLC0415

    audit = _Audit()
    audit.feed(markdown2html_mistune(markdown))
    audit.close()
    return audit.problem


# --------------------------------------------------------------------------- element ids
#: Prefix of every element id (and ``name``) that rendered markdown carries: a heading
#: ``# why_sqrt_dk`` is ``<h1 id="md-why_sqrt_dk">``, never an id of formgrader's own page
#: (the score box of the answer ``why_sqrt_dk``, ``statusmessage``) that its scripts look up.
ID_PREFIX = "md-"
_TAG = re.compile(r"<[A-Za-z][^<>]*>")
#: One attribute of a tag, its value quoted or not (each matched whole, in order, so
#: that ``id=`` inside another attribute's value is that value's text).
_ATTRIBUTE = re.compile(
    r"""(\s+)([^\s"'<>/=]+)(?:(\s*=\s*)(?:"([^"]*)"|'([^']*)'|([^\s"'<>]+)))?"""
)


def _prefix_attribute(m: re.Match) -> str:
    space, attr, eq = m.group(1, 2, 3)
    value = next((v for v in m.group(4, 5, 6) if v is not None), None)
    name = attr.lower()
    if value is None or name not in ("id", "name", "href"):
        return m.group(0)
    if name == "href":
        if not value.startswith("#") or value == "#":  # a link elsewhere: as it is
            return m.group(0)
        value = "#" + ID_PREFIX + value[1:]
    else:
        value = ID_PREFIX + value
    return f'{space}{attr}{eq}"{value}"'


def prefix_ids(html: str) -> str:
    """``html`` (rendered markdown) with :data:`ID_PREFIX` before every element id and
    name, and before the target of every link to a place in the page, so that links
    between headings still work and no id can be one of the page's own."""
    return _TAG.sub(lambda t: _ATTRIBUTE.sub(_prefix_attribute, t.group(0)), html)


def _render_markdown(source: str, attachments: dict, path: str) -> str:
    from nbconvert.filters.markdown_mistune import (  # noqa: PLC0415
        IPythonRenderer,
        MarkdownWithMath,
    )

    renderer = IPythonRenderer(escape=False, attachments=attachments, path=path)
    return MarkdownWithMath(renderer=renderer).render(source)


@pass_context
def markdown2html(context, source: str) -> str:
    """The HTML exporter's ``markdown2html`` filter, as formgrader's page and the feedback
    render every markdown cell (nbgrader_config.py: ``HTMLExporter.filters``), with every
    element id prefixed (:func:`prefix_ids`)."""
    cell = context.get("cell", {}) or {}
    path = (context.get("resources", {}) or {}).get("metadata", {}).get("path", "")
    return prefix_ids(_render_markdown(source, cell.get("attachments", {}) or {}, path))


def as_text(markdown: str) -> str:
    """``markdown`` shown whole as a code block (its text, nothing rendered)."""
    longest = max((len(r) for r in re.findall(r"`+", markdown)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{AS_TEXT_NOTE}{fence}\n{markdown.rstrip()}\n{fence}\n"


def inert_markdown(markdown: str) -> str:
    """``markdown`` as written, its raw HTML escaped and MathJax's link commands broken
    up; or, where it still renders to more than plain markdown (a ``javascript:`` link,
    an image from the web), shown whole as text."""
    escaped = defuse_tex(escape_raw_html(markdown))
    return escaped if not render_problem(escaped) else as_text(markdown)


# --------------------------------------------------------------------------- outputs
def _text(value: object) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _base64(value: object) -> bool:
    try:
        base64.b64decode(re.sub(r"\s", "", _text(value)), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def inert_data(data: dict) -> dict:
    """A display's mime bundle with only inert content (see the module's docstring)."""
    out = {}
    for mime, value in data.items():
        if mime not in KEPT:
            continue
        if mime in IMAGES:
            if _base64(value):
                out[mime] = value
        elif mime == "text/html":
            out[mime] = clean_html(_text(value))
        elif mime == "image/svg+xml":
            if svg_is_inert(_text(value)):
                out[mime] = value
        elif mime == "text/markdown":
            out[mime] = inert_markdown(_text(value))
        elif mime == "text/latex":
            out[mime] = defuse_tex(_text(value))
        else:
            out[mime] = value
    if data and not out:
        out["text/plain"] = REMOVED_NOTE.format(types=", ".join(sorted(data)))
    return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def inert_metadata(metadata: dict) -> dict:
    """An output's metadata with only numeric image sizes (nbconvert writes width and
    height into the page unquoted)."""
    out = {}
    for mime, value in metadata.items():
        if mime in IMAGES and isinstance(value, dict):
            sizes = {k: v for k, v in value.items() if k in ("width", "height") and _number(v)}
            if sizes:
                out[mime] = sizes
    return out


def inert_output(output: dict) -> None:
    """Make one output inert, in place."""
    if "data" in output:
        output["data"] = inert_data(dict(output["data"]))
    if "metadata" in output:
        output["metadata"] = inert_metadata(dict(output["metadata"]))
    if "execution_count" in output and not isinstance(output["execution_count"], int):
        output["execution_count"] = None


# --------------------------------------------------------------------------- notebooks
NBGRADER_KEYS = {
    "grade",
    "solution",
    "locked",
    "task",
    "points",
    "grade_id",
    "schema_version",
    "checksum",
    "cell_type",
}


def make_inert(nb, trusted_markdown: set[str] | frozenset[str] = frozenset()):
    """Make ``nb`` inert in place (and return it): outputs, markdown not in
    ``trusted_markdown`` (the sources of the instructor's markdown cells), metadata."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        nbg = cell.metadata.get("nbgrader")
        if isinstance(nbg, dict):
            for key in set(nbg) - NBGRADER_KEYS:
                del nbg[key]
        if "attachments" in cell:
            cell["attachments"] = {
                name: {m: v for m, v in bundle.items() if m in IMAGES and _base64(v)}
                for name, bundle in (cell["attachments"] or {}).items()
                if isinstance(bundle, dict)
            }
        if cell.cell_type == "markdown" and cell.source not in trusted_markdown:
            cell.source = inert_markdown(cell.source)
        elif cell.cell_type == "raw":
            cell.source = clean_html(cell.source)
        elif cell.cell_type == "code":
            if not isinstance(cell.get("execution_count"), int):
                cell["execution_count"] = None
            for output in cell.get("outputs", []):
                inert_output(output)
    return nb


def instructor_markdown(path: Path) -> frozenset[str]:
    """The sources of the markdown cells of the notebook at ``path`` (none if absent)."""
    import nbformat  # noqa: PLC0415

    if not path.is_file():
        return frozenset()
    source = nbformat.read(path, as_version=4)
    return frozenset(c.source for c in source.cells if c.cell_type == "markdown")


class Inert(Preprocessor):
    """Make a graded notebook inert (:func:`make_inert`); the instructor's own markdown,
    read from the assignment's source notebook, is kept as written."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off by default

    def preprocess(self, nb, resources):
        return make_inert(nb, self._trusted(resources)), resources

    def _trusted(self, resources) -> frozenset[str]:
        """The instructor's markdown of the notebook being converted: nbgrader's converters
        name it in ``resources["nbgrader"]``, formgrader's page in ``resources`` itself."""
        resources = resources or {}
        info = resources.get("nbgrader") or {}
        assignment = info.get("assignment") or resources.get("assignment_id")
        notebook = info.get("notebook") or resources.get("notebook_id")
        if not assignment or not notebook:
            return frozenset()
        from nbgrader.coursedir import CourseDirectory  # noqa: PLC0415

        course = CourseDirectory(config=self.config)
        folder = course.format_path(course.source_directory, ".", assignment)
        return instructor_markdown(Path(folder) / f"{notebook}.ipynb")
