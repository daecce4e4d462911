# Attention from Scratch: every target bootstraps .venv from requirements.lock when needed.
#   make lab       open the course in JupyterLab
#   make test      the test suite a contributor runs before each commit (CI runs it first):
#                  every kind of test, the per-notebook ones on the quick notebooks only
#   make test-later  what make test leaves out: the per-notebook tests on every other
#                  notebook (each solution executed, each student notebook executed, each
#                  solution graded), the longer runs of a kind make test covers (marked
#                  later) and the hostile classes; CI runs it after make test
#   make test-hostile  classes of hostile submissions graded: forged grades, injected script
#                  (alone; make test-later runs them too)
#   make test-alternatives  every catalogued correct alternative through its whole notebook
#                  (slow; CI runs it after make test-later)
#   make release   regenerate notebooks/ (student versions) from solutions/
#   make grade     autograde new submissions under submitted/ and export grades.csv
#                  (FORCE=1 regrades everything; ASSIGNMENTS="01_... 02_..." limits it;
#                  JOBS=N grades N submissions at a time, default: one per core;
#                  SCHEDULER=tls://host:8786 grades on that Dask cluster (instructor guide,
#                  "Grading on a cluster"); ALLOW_PLAINTEXT_SCHEDULER=1 accepts a tcp:// one)
#   make report    one folder per audience: report/class/ (report.html, report.csv, no
#                  student named), report/instructor/ (similar answers worth a look; with
#                  NAMES=1, the report naming students), report/lms/ (Canvas, Moodle grades)
#   make bench     print the benchmark figures
#   make versions  the oldest and the newest versions pyproject.toml allows, each installed
#                  into its own environment (.venv-oldest, .venv-newest), run the unit tests
#                  and every solution notebook (tools/versions.py; CI runs it after make test)
#                  (make versions-install only installs them; VERSIONS_ARGS=--installed then
#                  tests in them without installing again, as .ci/run does)
#   make alternatives-and-versions  the two above in two lanes (CI's last stage)
#   make student-edition  build the bytecode-only package for students' environments
#                  into $(EDITION) (default build/student-edition; see the instructor guide)
#   make lock      re-resolve requirements.lock and environment.yml (maintainers)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Extra pip arguments, e.g. a CPU-only PyTorch index on a Linux laptop (see README).
PIP_ARGS ?=
# Running as root (a container) needs --allow-root for JupyterLab.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
PYTEST_ARGS ?=
# `make test` runs four pytest processes side by side (its tests wait on kernels, servers
# and browsers as much as they compute: two lanes kept two cores half busy): the grading
# tests, in two lanes (a few students graded into PostgreSQL, the sandbox, the report, the
# exchange | a solution graded, a class graded on a Dask cluster; they grade with two
# workers themselves), the lane of real servers (the hub, JupyterLab in Chromium, the
# student edition's kernels, the check time limits, the trusted checker) and everything
# else (the checks, the catalogs, the unit tests). Each one's report appears when it ends.
# All leave out the marks every_notebook and later: make test-later runs those (the
# whole hostile class, the hub's whole workflow, the Triton catalog beyond one mistake per
# exercise, the cluster's faults beyond a killed worker, the trusted checker's sample).
# The catalog's alternatives run through whole notebooks in `make test-alternatives`.
GRADING_LANE = tests/test_class_grading.py tests/test_postgres.py tests/test_grading.py tests/test_sandbox.py \
	tests/test_report.py tests/test_exchange.py tests/test_cluster.py tests/test_repair.py
# The grading tests' second lane (the first: the rest of GRADING_LANE).
CLUSTER_LANE = tests/test_grading.py tests/test_cluster.py
# Quick tests of the course's tools that grade nothing (the similar answers page, the inert
# views, the benchmark's grading line, the gradebook's revision): in the grading lane, which
# ended first (119 s), rather than everything else's, which ended last (177 s). make versions
# runs them as it runs everything else's.
CLASS_LANE_EXTRA = tests/test_similarity.py tests/test_inert.py tests/test_bench.py \
	tests/test_gradebook_version.py tests/test_busy_grading.py
SERVERS_LANE = tests/test_hub.py tests/test_browser.py tests/test_student_edition.py \
	tests/test_check_timeouts.py tests/test_trusted_checker.py
# Each lane's report names its slowest tests: what to move between lanes, or to make test-later.
DURATIONS = --durations=8
QUICK_MARKS = not all_alternatives and not every_notebook and not later and not busy
# Whole hostile classes graded (forgers of grades, injections into the instructor's views):
# in make test-later's solutions lane (a few minutes), or alone with `make test-hostile`.
HOSTILE_LANE = tests/test_forgery.py tests/test_inert_views.py
ASSIGNMENTS ?=
JOBS ?=
SCHEDULER ?=
ALLOW_PLAINTEXT_SCHEDULER ?=

export PATH := $(abspath $(BIN)):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: lab test test-class-lane test-cluster-lane test-servers-lane test-other-lane test-later test-later-solutions \
	test-later-runs test-busy test-hostile release grade report bench mutants lint format lock venv clean \
	student-edition versions versions-install test-alternatives alternatives-and-versions

venv: $(STAMP)

# Re-runs only when the lock or the package metadata changed. pip compiles the bytecode of
# what it installs one file at a time; compileall compiles it on every core instead (into a
# new .venv on a 2-core machine: 78 s against 36 + 15 s, and 106 against 70 + 19 s with the
# disk busy). The bytecode is needed: where
# PYTHONDONTWRITEBYTECODE is set (as on CI's machines) every process would compile PyTorch
# again. compileall's exit status is not: it fails on the files that are not Python 3.11
# (torch ships one written for 3.12), which pip skips in silence too.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11 or newer is needed; found " + sys.version.split()[0] + ". Run: make PYTHON=python3.11")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile $(PIP_ARGS) -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks $(ROOT_FLAG)

test: $(STAMP)
	@echo "make test: four lanes (grading | grading on a cluster | servers | everything else); reports follow as each ends"
	@$(MAKE) --no-print-directory -j4 --output-sync=target test-class-lane test-cluster-lane \
		test-servers-lane test-other-lane

test-class-lane: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(DURATIONS) -m "$(QUICK_MARKS)" $(filter-out $(CLUSTER_LANE),$(GRADING_LANE)) \
		$(CLASS_LANE_EXTRA)

test-cluster-lane: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(DURATIONS) -m "$(QUICK_MARKS)" $(CLUSTER_LANE)

test-servers-lane: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(DURATIONS) -m "$(QUICK_MARKS)" $(SERVERS_LANE)

test-other-lane: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) $(DURATIONS) -m "not all_alternatives and not every_notebook and not later and not busy" \
		$(addprefix --ignore=,$(GRADING_LANE) $(HOSTILE_LANE) $(SERVERS_LANE) $(CLASS_LANE_EXTRA))

# What make test leaves out: the per-notebook tests on every notebook but conftest.py's
# QUICK_NOTEBOOKS (the solutions executed by nbval, with the hub's workflow, the Triton
# catalog, the trusted checker's sample and the mutants of notebooks 08-13 to balance the
# lanes | the student notebooks executed and the solutions graded, and the other tests marked
# later). Two lanes, side by side. .ci/run runs it after make test.
LATER_WITH_SOLUTIONS = tests/test_hub.py tests/test_catalog.py tests/test_trusted_checker.py \
	tests/test_mutants.py
test-later: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-later-solutions test-later-runs

# The solutions lane ended long before the other (514 | 920 s on a fresh clone), so the
# hostile classes follow it there (942 | 1100 s, then, on a machine busy with other work), in the same two lanes: both pytest runs report, and either failing
# fails the lane.
test-later-solutions: $(STAMP)
	@status=0; \
	$(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(DURATIONS) \
		-m "every_notebook or later" solutions $(LATER_WITH_SOLUTIONS) || status=1; \
	$(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(DURATIONS) \
		$(HOSTILE_LANE) || status=1; \
	exit $$status

test-later-runs: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(DURATIONS) \
		-m "every_notebook or later" \
		$(addprefix --ignore=,$(HOSTILE_LANE) $(LATER_WITH_SOLUTIONS)) tests

# A semester's class graded beside busy processes at ten times the cores' load average
# (tests/test_busy_class.py): it keeps both cores busy on purpose, so it runs alone, never
# beside another lane: .ci/run runs it after make test-later (about 12 minutes here). -s
# prints each class's seconds and load average.
test-busy: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(DURATIONS) -s -m busy \
		tests/test_busy_class.py

# Classes of forgers and injectors graded in the sandbox (tests/test_forgery.py,
# tests/test_inert_views.py) alone; make test-later runs them too.
test-hostile: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(HOSTILE_LANE)

# The catalog's correct alternatives through every notebook (tests/test_alternatives_in_notebooks.py:
# 65 notebook runs, too many for make test's 10 minutes), in two lanes. .ci/run runs it after
# make test-later.
test-alternatives: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-alternatives-1 test-alternatives-2

# Each notebook runs on one core (one PyTorch thread): two lanes, every other run each.
test-alternatives-%: $(STAMP)
	ALTERNATIVES_LANE=$*/2 $(BIN)/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider \
		-m all_alternatives tests/test_alternatives_in_notebooks.py

release: $(STAMP)
	$(BIN)/python -m attention_ref.course release

grade: $(STAMP)
	$(BIN)/python -m attention_ref.course grade $(if $(FORCE),--force,) $(if $(JOBS),--jobs $(JOBS),) \
		$(if $(SCHEDULER),--scheduler $(SCHEDULER),) \
		$(if $(ALLOW_PLAINTEXT_SCHEDULER),--allow-plaintext-scheduler,) $(ASSIGNMENTS)

report: $(STAMP)
	$(BIN)/python -m attention_ref.course report $(if $(NAMES),--names,) $(ASSIGNMENTS)

bench: $(STAMP)
	$(BIN)/python -m attention_ref.bench all

# Mutation testing of the checks (tools/mutants.py): each function exercise's solution
# mutated one change at a time, each mutant through the self-check; a survivor not listed
# in tools/mutants_equivalent.txt is a gap. MUTANTS_ARGS="--notebooks 01 02 --graded".
MUTANTS_ARGS ?=
mutants: $(STAMP)
	$(BIN)/python tools/mutants.py $(MUTANTS_ARGS)

# The ranges in pyproject.toml at both ends: each end in its own environment, side by side.
VERSIONS_ARGS ?=
versions: $(STAMP)
	PIP_ARGS="$(PIP_ARGS)" $(BIN)/python tools/versions.py $(VERSIONS_ARGS)

# CI's last stage: make test-alternatives and make versions in two lanes, each lane one
# lane of the alternatives then one end of the versions (the alternatives' longer lane with
# the versions' shorter end), so that no core waits for the other's last notebook: one
# stage after the other, each waited about 40 s for its longer lane (305 + 385 s). An end
# whose install is still under way (make versions-install, beside make test-later) is
# waited for.
alternatives-and-versions: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target alternatives-and-versions-1 \
		alternatives-and-versions-2

alternatives-and-versions-%: $(STAMP)
	@status=0; \
	$(MAKE) --no-print-directory test-alternatives-$* || status=1; \
	PIP_ARGS="$(PIP_ARGS)" $(BIN)/python tools/versions.py $(VERSIONS_ARGS) \
		$(word $*,oldest newest) || status=1; \
	exit $$status

versions-install: $(STAMP)
	PIP_ARGS="$(PIP_ARGS)" $(BIN)/python tools/versions.py --install-only

EDITION ?= build/student-edition
student-edition: $(STAMP)
	$(BIN)/python -m attention_ref.course.edition build $(EDITION)

lint: $(STAMP)
	$(BIN)/ruff check attention_ref tests tools solutions notebooks
	$(BIN)/ruff format --check attention_ref tests tools solutions notebooks

format: $(STAMP)
	$(BIN)/ruff format attention_ref tests tools solutions
	$(BIN)/ruff check --fix attention_ref tests tools solutions

# Maintainers: resolve the newest versions the pyproject ranges allow and write the lock.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet $(PIP_ARGS) -e '.[dev,kernels]'
	$(PYTHON) tools/lock.py .lock-venv requirements.lock environment.yml
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .venv-oldest .venv-newest build/versions .pytest_cache .ruff_cache gradebook.db autograded feedback grades.csv report
