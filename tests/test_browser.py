"""The course in a real browser: JupyterLab, driven by headless Chromium (Playwright).

JupyterLab is started from this environment on 127.0.0.1 (a free port, token auth) over a
throwaway copy of the course, so nothing in the checkout is changed. Chromium opens the
student notebook NOTEBOOK, runs every cell one by one as a learner stepping through it
would, and the test asserts what the learner sees: the course kernel, rendered markdown
and math, a plot as an image, no error but the NotImplementedError of the exercises still
to do, and nbgrader's Validate button. Then the solution notebook runs and every graded
test cell passes.

Screenshots are saved under test-artifacts/browser/ (gitignored) and their paths printed.
Chromium is the system's (Debian's ``chromium``; set CHROMIUM to use another binary): no
browser download. Without it, or without Playwright, the tests are skipped with the
reason, except under CI (the environment variable CI is set, as .ci/run does), where they
fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course_tools import ROOT, release_path, solution_path

pytestmark = pytest.mark.notebooks

# The notebook the learner opens. Its student version (notebooks/) and its source with
# solutions (solutions/) are both driven.
NOTEBOOK = "01_dot_product_attention"
# A notebook whose first training cell (tagged "training") is short: the progress bar the
# learner sees while a model trains is tqdm's widget, and it must render and finish.
TRAINING_NOTEBOOK = "07_decoder_and_transformer"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
KERNEL_DISPLAY_NAME = "Python 3 (ipykernel)"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CELL_TIMEOUT_MS = 120_000
# How JupyterLab shows tracebacks (and stderr).
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'


def unavailable(reason: str):
    """Skip, or fail under CI: a CI machine must run every test."""
    if os.environ.get("CI"):
        pytest.fail(
            f"browser test cannot run: {reason} (CI is set, so this fails instead of skipping)",
            pytrace=False,
        )
    pytest.skip(f"browser test skipped: {reason}")


def chromium_path() -> str | None:
    if os.environ.get("CHROMIUM"):  # an explicit choice: that binary or nothing
        return os.environ["CHROMIUM"] if os.access(os.environ["CHROMIUM"], os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


class Lab:
    """A JupyterLab server over ``root``: ``url(path)`` opens a file in it."""

    def __init__(self, root: Path, home: Path):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        env = dict(os.environ)
        # A fresh Jupyter home: no user settings, kernels or workspaces leak in; the
        # environment's own (.venv/share/jupyter, .venv/etc/jupyter) still apply.
        for var, sub in [
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ]:
            env[var] = str(home / sub)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env.pop("NBGRADER_DB_URL", None)
        env.pop("MPLBACKEND", None)  # conftest sets Agg; the kernel must use the inline one
        settings = home / "settings"
        # Render every cell (no virtual scrolling), no news or update pop-ups.
        write_json(
            settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
            {"windowingMode": "none"},
        )
        write_json(
            settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
            {"fetchNews": "false", "checkForUpdates": False},
        )
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log = open(home / "jupyterlab.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log_path = home / "jupyterlab.log"

    def url(self, path: str) -> str:
        # reset: a fresh workspace, with no tab left open by an earlier page.
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?reset&token={self.token}"

    def wait_ready(self, timeout: float = 120) -> None:
        status = f"http://127.0.0.1:{self.port}/api/status?token={self.token}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(status, timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not start in {timeout} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def lab():
    """JupyterLab over a copy of the course (nbgrader_config.py, NOTEBOOK's student and
    solution folders, TRAINING_NOTEBOOK's solution folder)."""
    for path in (release_path(NOTEBOOK), solution_path(NOTEBOOK)):
        assert path.exists(), f"{path} is missing; run `make release`"
    tmp = Path(tempfile.mkdtemp(prefix="attention-lab-"))
    course = tmp / "course"
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course)
    for folder in ("notebooks", "solutions"):
        shutil.copytree(ROOT / folder / NOTEBOOK, course / folder / NOTEBOOK)
    shutil.copytree(
        ROOT / "solutions" / TRAINING_NOTEBOOK, course / "solutions" / TRAINING_NOTEBOOK
    )
    server = Lab(course, tmp / "jupyter")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium with a fresh profile."""
    executable = chromium_path()
    if executable is None:
        where = (
            f"CHROMIUM={os.environ['CHROMIUM']} is not an executable"
            if os.environ.get("CHROMIUM")
            else "no `chromium` on PATH, no /usr/bin/chromium"
        )
        unavailable(
            f"Chromium is not installed ({where}); install it with "
            "`apt-get install -y chromium` (.ci/run does) or set CHROMIUM to a Chromium binary"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed; run `make test` to install requirements.lock")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="attention-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


SHOTS: list[Path] = []


def screenshot(page, name: str, locator=None, notebook: str = NOTEBOOK) -> Path:
    path = ARTIFACTS / f"{notebook}-{name}.png"
    (locator or page).screenshot(path=str(path))
    SHOTS.append(path)
    return path


@pytest.fixture(autouse=True)
def report_screenshots(capsys):
    """Print the screenshots each test saved, even when pytest captures output."""
    SHOTS.clear()
    yield
    with capsys.disabled():
        for path in SHOTS:
            print(f"\n  screenshot: {path}", end="")
        if SHOTS:
            print()


# JavaScript run in the page. window.jupyterapp is there thanks to expose_app_in_browser.
KERNEL_IDLE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session
            && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && w.content.widgets.length > 0;
}"""

RUN_CELL = """async (i) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = i;
  nb.deselectAll();
  await app.commands.execute('notebook:run-cell');
  const cell = nb.widgets[i];
  return cell.model.type === 'code' ? cell.model.executionCount : null;
}"""

CELLS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(cell => {
  const m = cell.model;
  const outputs = [];
  if (m.type === 'code') {
    for (let j = 0; j < m.outputs.length; j++) outputs.push(m.outputs.get(j).toJSON());
  }
  return {type: m.type, count: m.type === 'code' ? m.executionCount : null,
          nbgrader: (m.getMetadata('nbgrader') || {}), outputs: outputs};
})"""


def open_notebook(browser, lab: Lab, rel: str):
    page = browser.new_page()
    page.set_default_timeout(60_000)
    page.goto(lab.url(rel))
    page.wait_for_selector(".jp-NotebookPanel", state="visible", timeout=90_000)
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)
    return page


def run_every_cell(page) -> list[dict]:
    """Run the cells one at a time, top to bottom, as a learner pressing Shift+Enter would:
    an error stops only its own cell (Run All would skip everything after it)."""
    n = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.length")
    for i in range(n):
        page.evaluate(RUN_CELL, i)
    page.wait_for_function(KERNEL_IDLE, timeout=CELL_TIMEOUT_MS)
    return page.evaluate(CELLS)


def errors_of(cells: list[dict]) -> list[tuple[int, str, str]]:
    return [
        (i, o["ename"], o["evalue"])
        for i, c in enumerate(cells)
        for o in c["outputs"]
        if o["output_type"] == "error"
    ]


def text_of(cell: dict) -> str:
    out = []
    for o in cell["outputs"]:
        if o["output_type"] == "stream":
            out.append("".join(o["text"]) if isinstance(o["text"], list) else o["text"])
        elif "text/plain" in o.get("data", {}):
            out.append(str(o["data"]["text/plain"]))
    return "".join(out)


def is_test_cell(cell: dict) -> bool:
    nbg = cell["nbgrader"]
    return bool(nbg.get("grade")) and not nbg.get("solution") and cell["type"] == "code"


def test_a_learner_opens_and_runs_the_student_notebook(browser, lab):
    source = nbformat.read(release_path(NOTEBOOK), as_version=4)
    rel = f"notebooks/{NOTEBOOK}/{NOTEBOOK}.ipynb"
    page = open_notebook(browser, lab, rel)
    panel = page.locator(".jp-NotebookPanel:visible").first

    # The course kernel, chosen from the notebook's metadata: no kernel dialog.
    kernel = panel.locator(".jp-Toolbar-kernelName").first
    assert kernel.inner_text().strip() == KERNEL_DISPLAY_NAME
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()

    # The explanation renders: every markdown cell, the title as a heading, math typeset.
    n_markdown = sum(c.cell_type == "markdown" for c in source.cells)
    rendered = panel.locator(".jp-MarkdownCell .jp-RenderedMarkdown")
    assert rendered.count() == n_markdown
    title = next(
        line.lstrip("# ").strip()
        for line in source.cells[0].source.splitlines()
        if line.startswith("# ")
    )
    assert panel.locator(".jp-RenderedMarkdown h1").first.inner_text().startswith(title[:20])
    assert panel.locator(".jp-RenderedMarkdown mjx-container").count() > 0, "no math rendered"

    # nbgrader's assignment tools: the Validate button and the Nbgrader menu.
    validate = panel.locator(".jp-Toolbar .validate-button")
    assert validate.count() == 1 and validate.is_visible()
    assert validate.inner_text().strip() == "Validate"
    assert page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").count() == 1
    screenshot(page, "student-opened")

    cells = run_every_cell(page)

    # Every code cell ran.
    unrun = [i for i, c in enumerate(cells) if c["type"] == "code" and c["count"] is None]
    assert not unrun, f"code cells {unrun} did not run"
    # The only errors are the stubs of the exercises, and every graded test cell fails.
    errors = errors_of(cells)
    assert errors, "the student notebook ran without the exercise stubs failing"
    other = [e for e in errors if e[1] != "NotImplementedError" and "not implemented" not in e[2]]
    assert not other, f"errors other than NotImplementedError (cell, name, message): {other}"
    failing = {i for i, _, _ in errors}
    tests = [i for i, c in enumerate(cells) if is_test_cell(c)]
    assert tests and set(tests) <= failing, f"test cells {sorted(set(tests) - failing)} passed"

    # The learner sees a plot, and the tracebacks.
    images = panel.locator(".jp-OutputArea-output img")
    assert images.count() >= 1, "no plot appeared"
    first = images.first
    first.scroll_into_view_if_needed()
    assert first.is_visible()
    box = first.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100
    screenshot(page, "student-plot")
    screenshot(page, "student-plot-only", first)
    error_view = panel.locator(STDERR_OUTPUT, has_text="NotImplementedError").first
    error_view.scroll_into_view_if_needed()
    assert error_view.is_visible()
    screenshot(page, "student-stub-error")

    # Validate (nbgrader, server side) reports the failing tests, as it would to a learner.
    validate.click()
    dialog = page.locator(".jp-Dialog").first
    dialog.wait_for(state="visible", timeout=CELL_TIMEOUT_MS)
    page.wait_for_function(
        "() => !document.querySelector('.jp-Dialog').innerText.includes('Validating')",
        timeout=CELL_TIMEOUT_MS,
    )
    report = dialog.inner_text()
    assert "Validation Results" in report and "failed" in report, report
    assert "NotImplementedError" in report, report
    screenshot(page, "student-validate")
    page.close()


@pytest.mark.later
def test_the_solution_notebook_passes_every_test_in_the_browser(browser, lab):
    rel = f"solutions/{NOTEBOOK}/{NOTEBOOK}.ipynb"
    page = open_notebook(browser, lab, rel)
    kernel = page.locator(".jp-NotebookPanel:visible .jp-Toolbar-kernelName").first
    assert kernel.inner_text().strip() == KERNEL_DISPLAY_NAME
    cells = run_every_cell(page)
    unrun = [i for i, c in enumerate(cells) if c["type"] == "code" and c["count"] is None]
    assert not unrun, f"code cells {unrun} did not run"
    assert not errors_of(cells), f"errors (cell, name, message): {errors_of(cells)}"
    tests = [c for c in cells if is_test_cell(c)]
    assert tests, "no graded test cells found"
    for c in tests:
        assert "passed" in text_of(c), f"test cell {c['nbgrader']['grade_id']}: {text_of(c)}"
    panel = page.locator(".jp-NotebookPanel:visible").first
    shown = panel.locator(STDERR_OUTPUT, has_text="Error").all_inner_texts()
    assert not shown, f"error outputs on screen: {[t[:300] for t in shown]}"
    images = panel.locator(".jp-OutputArea-output img")
    assert images.count() >= 1
    last_test = panel.locator(".jp-Cell").nth(
        max(i for i, c in enumerate(cells) if is_test_cell(c))
    )
    last_test.scroll_into_view_if_needed()
    screenshot(page, "solution-passed")

    # nbgrader's Validate agrees.
    panel.locator(".jp-Toolbar .validate-button").click()
    dialog = page.locator(".jp-Dialog").first
    dialog.wait_for(state="visible", timeout=CELL_TIMEOUT_MS)
    page.wait_for_function(
        "() => !document.querySelector('.jp-Dialog').innerText.includes('Validating')",
        timeout=CELL_TIMEOUT_MS,
    )
    report = dialog.inner_text()
    assert "Success! Your notebook passes all the tests." in report, report
    screenshot(page, "solution-validate")
    page.close()


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.later
def test_a_training_cell_shows_a_progress_bar_widget_that_finishes(browser, lab):
    """tqdm.auto draws the training progress as a JupyterLab widget (not lines of text),
    and the bar reaches 100%."""
    source = nbformat.read(solution_path(TRAINING_NOTEBOOK), as_version=4)
    tagged = [
        i
        for i, c in enumerate(source.cells)
        if c.cell_type == "code" and "training" in c.metadata.get("tags", [])
    ]
    assert tagged, f"{TRAINING_NOTEBOOK} has no cell tagged 'training'"
    target = tagged[0]
    page = open_notebook(browser, lab, f"solutions/{TRAINING_NOTEBOOK}/{TRAINING_NOTEBOOK}.ipynb")
    for i in range(target + 1):
        page.evaluate(RUN_CELL, i)
    page.wait_for_function(KERNEL_IDLE, timeout=CELL_TIMEOUT_MS)
    cells = page.evaluate(CELLS)
    assert not errors_of(cells[: target + 1]), f"errors: {errors_of(cells[: target + 1])}"
    outputs = cells[target]["outputs"]
    assert any(WIDGET_VIEW in o.get("data", {}) for o in outputs), (
        f"the training cell (cell {target}) shows no widget; its outputs: "
        f"{[sorted(o.get('data', {o['output_type']: 0})) for o in outputs]}"
    )
    cell = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(target)
    # ipywidgets' horizontal progress bar; tqdm turns it green ("success") when it ends.
    bar = cell.locator(".widget-hprogress").first
    bar.wait_for(state="attached", timeout=CELL_TIMEOUT_MS)
    bar.scroll_into_view_if_needed()
    assert bar.is_visible(), "the progress bar widget is not visible"
    assert bar.locator(".progress-bar-success").count() == 1, "the bar did not finish"
    shown = cell.locator(".jp-OutputArea").inner_text()
    assert "100%" in shown, f"the progress bar did not reach 100%: {shown[:300]!r}"
    screenshot(page, "training-progress", cell, notebook=TRAINING_NOTEBOOK)
    page.close()
