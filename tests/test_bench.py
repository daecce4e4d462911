"""The benchmark command runs a tiny configuration quickly and prints well-formed lines; the
apps benchmark reports a missing or failing application and exits non-zero."""

from __future__ import annotations

import re
import types

import pytest

from attention_ref import bench
from attention_ref.course.plumbing import assignments, course_root

TINY = [
    "attention",
    "--device",
    "cpu",
    "--lengths",
    "64",
    "96",
    "--heads",
    "2",
    "--d-head",
    "8",
    "--block-size",
    "32",
    "--q-block-size",
    "16",
    "--repeats",
    "1",
    "--kv-tokens",
    "6",
    "--kv-d-model",
    "16",
    "--threads",
    "1",
]


def test_registry_names_the_benchmarks():
    assert {"attention", "apps"} <= set(bench.BENCHMARKS)


def test_attention_benchmark_prints_one_line_per_length_and_the_cache_speedup(capsys):
    assert bench.main(TINY) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("attention device=cpu threads=1 ")
    num = r"\d+\.\d+"
    row = re.compile(
        rf"n=(\d+) naive_ms={num} naive_mib={num} online_ms={num} online_mib={num} "
        rf"torch_ms={num} torch_mib={num} naive/torch_time={num}x online/torch_time={num}x "
        rf"online/naive_mem={num}x$"
    )
    rows = [row.match(line) for line in lines[1:3]]
    assert all(rows), lines
    assert [int(m.group(1)) for m in rows] == [64, 96]
    assert re.match(
        rf"kv_cache tokens=6 recompute_s={num} cached_s={num} speedup={num}x same_tokens=True$",
        lines[3],
    ), lines[3]


def test_attention_benchmark_runs_once_per_thread_count_by_default(capsys):
    assert bench._parser().parse_args(["attention"]).threads == [1, 2]
    assert bench.main([*TINY, "--threads", "1", "2", "--kv-tokens", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith("attention device=cpu")]
    assert [lines[i].split()[2] for i in headers] == ["threads=1", "threads=2"]
    assert headers == [0, 3]  # a header, then one row per length, for each thread count
    assert all(lines[i].startswith("n=") for i in (1, 2, 4, 5))


def test_the_online_time_target_is_checked_for_each_thread_count(monkeypatch, capsys):
    monkeypatch.setattr(
        bench,
        "_attention_line",
        lambda n, opts, device: {"n": n, "online_s": 1.4, "torch_s": 1.0},
    )
    argv = ["attention", "--device", "cpu", "--lengths", "4096", "--kv-tokens", "0"]
    assert bench.main([*argv, "--strict"]) == 0
    out = capsys.readouterr().out
    assert "target online_time_4096<=1.5x_torch threads=1: met (1.40x)" in out
    assert "target online_time_4096<=1.5x_torch threads=2: met (1.40x)" in out


def test_naive_attention_is_skipped_with_its_memory_requirement(capsys):
    assert bench.main([*TINY, "--naive-limit-gib", "0.0001", "--kv-tokens", "0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"n=96 naive=skipped\(needs 0\.1 MiB for scores\+weights > limit", out)
    row = next(line for line in out.splitlines() if line.startswith("n=96 "))
    assert "online_ms=" in row and "torch_ms=" in row and "online/naive_mem" not in row


def test_naive_memory_requirement_is_two_n_by_n_matrices_per_head():
    assert bench.naive_bytes(1, 8, 16384, 4) == 16 * 2**30  # scores and weights, 8 GiB each


def _fake_app(metric, value, seconds):
    result = types.SimpleNamespace(metric=metric, value=value, train_seconds=seconds)
    return lambda: result


def test_apps_benchmark_prints_one_line_per_app(monkeypatch, capsys):
    modules = {
        "attention_ref.apps.translation": types.SimpleNamespace(
            train_translation=_fake_app("exact_match", 0.9951, 48.12)
        ),
        "attention_ref.apps.qa": types.SimpleNamespace(train_qa=_fake_app("exact_match", 0.9, 5)),
        "attention_ref.apps.summarization": types.SimpleNamespace(
            train_summarization=_fake_app("sentence_f1", 0.875, 12.0)
        ),
        "attention_ref.apps.language_model": types.SimpleNamespace(
            train_gpt=_fake_app("cross_entropy_over_floor", 1.0081, 49.04)
        ),
        "attention_ref.apps.modern_lm": types.SimpleNamespace(
            train_modern=_fake_app("modern_cross_entropy_over_floor", 1.0142, 64.2)
        ),
        "attention_ref.convert": types.SimpleNamespace(
            bench_convert=_fake_app("max_logit_diff_float32", 3.6e-6, 6.6)
        ),
        "attention_ref.apps.variants": types.SimpleNamespace(
            bench_variants=_fake_app("max_logit_diff_float32", 5.0e-6, 3.1)
        ),
    }
    monkeypatch.setattr(bench.importlib, "import_module", modules.__getitem__)
    assert bench.main(["apps"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "app=translation metric=exact_match value=0.995 train_seconds=48.1",
        "app=qa metric=exact_match value=0.900 train_seconds=5.0",
        "app=summarization metric=sentence_f1 value=0.875 train_seconds=12.0",
        "app=gpt metric=cross_entropy_over_floor value=1.008 train_seconds=49.0",
        "app=modern metric=modern_cross_entropy_over_floor value=1.014 train_seconds=64.2",
        "app=convert metric=max_logit_diff_float32 value=3.6e-06 train_seconds=6.6",
        "app=variants metric=max_logit_diff_float32 value=5.0e-06 train_seconds=3.1",
    ]


def test_apps_benchmark_reports_a_missing_or_failing_app_and_exits_nonzero(monkeypatch, capsys):
    def boom():
        raise RuntimeError("diverged")

    modules = {
        "attention_ref.apps.translation": types.SimpleNamespace(),
        "attention_ref.apps.qa": types.SimpleNamespace(train_qa=boom),
        "attention_ref.apps.summarization": types.SimpleNamespace(
            train_summarization=_fake_app("sentence_f1", 0.875, 12.0)
        ),
    }
    monkeypatch.setattr(bench.importlib, "import_module", modules.__getitem__)
    assert bench.main(["apps"]) == 1
    out = capsys.readouterr().out
    assert "app=translation FAILED: LookupError: attention_ref.apps.translation has no " in out
    assert "app=qa FAILED: RuntimeError: diverged" in out
    assert "app=summarization metric=sentence_f1 value=0.875" in out
    assert out.rstrip().endswith("FAILED: apps")


def test_unknown_benchmark_is_a_usage_error():
    with pytest.raises(SystemExit):
        bench.main(["nonsense"])


def test_grading_benchmark_measures_the_old_grading_in_the_same_run(monkeypatch, capsys):
    """The baseline is graded with one worker and full training, and the class ratio is
    the best time over the baseline scaled to the class (grading itself is faked here:
    the real one takes minutes; tests/test_grading.py proves grading)."""
    calls = []

    def fake_make_grade(course, jobs, env=None):
        students = sorted(p.name for p in (course / "submitted").iterdir())
        calls.append((course.name, jobs, dict(env or {}), students))
        if course.name == "loop":
            out = "   [1/2] 01 solution: graded (8.0 s)\n   [2/2] 01 looping: graded (50.0 s)\n"
            return 58.0, out
        if course.name == "baseline":
            return 150.0 * len(students), ""
        if course.name == "class-without-sandbox":
            return 230.0, ""
        if course.name == "class-without-trusted_checker":
            return 220.0, ""
        if course.name == "class-without-grading_editions":
            return 245.0, ""
        return {1: 400.0, 2: 250.0}[jobs], ""

    monkeypatch.setattr(bench, "_make_grade", fake_make_grade)
    monkeypatch.setattr(bench, "_interrupted", lambda path: (["30", "10"], 1))
    argv = ["grading", "--students", "4", "--baseline-students", "2", "--cluster-students", "0"]
    assert bench.main([*argv, "--strict"]) == 1  # a missed target fails with --strict
    out = capsys.readouterr().out
    baseline = [c for c in calls if c[0] == "baseline"]
    assert baseline == [("baseline", 1, {"ATTENTION_REF_GRADING_STEPS": "all"}, baseline[0][3])]
    assert len(baseline[0][3]) == 2
    assert [c[1] for c in calls if c[0].startswith("class")] == [1, 2, 2, 2, 2]
    # The sandbox's cost: the class with two workers, graded again without it.
    assert calls[-3][:3] == ("class-without-sandbox", 2, {"ATTENTION_REF_SANDBOX": "off"})
    assert "sandboxed_s=250.0 unsandboxed_s=230.0 ratio=1.087" in out
    assert "target sandbox<=1.10x_unsandboxed: met (1.087x)" in out
    # The trusted checker's cost: the same class graded again as the kernel judges it.
    assert calls[-2][:3] == (
        "class-without-trusted_checker",
        2,
        {"ATTENTION_REF_TRUSTED_CHECKER": "off"},
    )
    assert "checker_s=250.0 kernel_judged_s=220.0 ratio=1.136" in out
    assert "target checker<=1.25x_kernel_judged: met (1.136x)" in out
    # The grading editions' cost: the class graded again with the student edition.
    assert calls[-1][:3] == (
        "class-without-grading_editions",
        2,
        {"ATTENTION_REF_GRADING_EDITIONS": "off"},
    )
    assert "editions_s=250.0 student_edition_s=245.0 ratio=1.020" in out
    assert "target editions<=1.05x_student_edition: met (1.020x)" in out
    assert "grading loop notebook=01_dot_product_attention exercise=sdpa" in out
    assert "after_s=42.0" in out
    n_aids = len(assignments(course_root()))
    baseline_line = f"grading baseline students=2 assignments={n_aids} jobs=1 training=full"
    assert f"{baseline_line} seconds=300.0" in out
    # best 250 s against 150 s x 4 students = 600 s
    assert "old_sequential_s=600 (measured in this run: 150.0 s per student x 4) ratio=0.42" in out
    assert "target class<=1/3_old_sequential: MISSED (0.42x)" in out
    assert bench.main(argv) == 0  # and only then


def test_grading_benchmark_compares_the_local_and_a_two_worker_cluster(monkeypatch, capsys):
    """The same class graded by make grade on its local cluster and on a running two-worker
    cluster: both times, their ratio, and the engine's overhead read from make grade's
    engine line, spread over a class of 20 for the target (grading faked, as above)."""
    import contextlib

    calls = []
    engine = (
        "engine: templates 1.0 s, cluster {once} s; per job: grading 20.0 s, around it on "
        "its worker 0.30 s, writing its result 0.50 s (overhead 4.0%)\n"
    )

    def fake_make_grade(course, jobs, env=None):
        students = sorted(p.name for p in (course / "submitted").iterdir())
        calls.append((course.name, jobs, dict(env or {}), students))
        once = "9.0" if course.name == "cluster-local" else "3.0"
        return (60.0 if course.name == "cluster-local" else 66.0), engine.format(once=once)

    @contextlib.contextmanager
    def fake_cluster(tmp, workers=2):
        calls.append(("dask", workers, {}, []))
        yield "tcp://127.0.0.1:9999"

    monkeypatch.setattr(bench, "_make_grade", fake_make_grade)
    monkeypatch.setattr(bench, "_dask_cluster", fake_cluster)
    argv = ["grading", "--cluster-only", "--cluster-students", "4"]
    assert bench.main([*argv, "--strict"]) == 0  # 9.0% at 20 students: met
    out = capsys.readouterr().out
    assert [c[:2] for c in calls] == [("cluster-local", 2), ("dask", 2), ("cluster-cluster", 2)]
    assert calls[0][2] == {} and len(calls[0][3]) == 4
    assert calls[2][2] == {
        "ATTENTION_REF_SCHEDULER": "tcp://127.0.0.1:9999",
        "ATTENTION_REF_ALLOW_PLAINTEXT_SCHEDULER": "1",
    }
    # local: (0.8 + 10.0 * 2 / 4) / 20 = 0.29; at 20 students (0.8 + 10.0 * 2 / 20) / 20 = 0.09
    assert "engine_per_job_s=0.80 engine_once_s=10.0 overhead_share=0.290" in out
    assert "overhead_share_at_20=0.090" in out
    assert "overhead_share_at_20=0.060" in out  # the cluster: (0.8 + 4.0 * 2 / 20) / 20
    assert "grading cluster students=4 local_s=60.0 two_worker_cluster_s=66.0 ratio=1.10" in out
    assert "target engine_overhead<=10%_per_job_at_20_students: met (9.0%" in out
    assert bench.main(argv) == 0


def test_calibration_prints_one_line_of_positive_figures_per_thread_count(capsys):
    """The figures themselves depend on the machine: only their form is checked."""
    import torch

    before = torch.get_num_threads()
    assert bench.main(["calibrate", "--threads", "1", "2"]) == 0
    assert torch.get_num_threads() == before  # restored
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    num = r"(\d+\.\d+)"
    form = re.compile(rf"calibration threads=(\d+) matmul_s={num} train_s={num} cpu_s={num} \(")
    for line, threads in zip(lines, (1, 2), strict=True):
        m = form.match(line)
        assert m, line
        assert int(m.group(1)) == threads
        assert float(m.group(2)) > 0 and float(m.group(3)) > 0


def test_no_argument_runs_everything_with_the_calibration_first(monkeypatch):
    assert bench._parser().parse_args([]).which == "all"
    assert next(iter(bench.BENCHMARKS)) == "calibrate"
    ran = []
    for name in bench.BENCHMARKS:
        monkeypatch.setitem(
            bench.BENCHMARKS,
            name,
            bench.Benchmark(name, "", lambda opts, name=name: ran.append(name) or True),
        )
    assert bench.main([]) == 0
    assert ran == list(bench.BENCHMARKS) and ran[0] == "calibrate"


def test_notebooks_benchmark_prints_each_notebook_s_seconds_against_its_budget(capsys):
    assert bench.main(["notebooks", "--notebooks", "01_dot_product_attention"]) == 0
    out = capsys.readouterr().out
    line = re.search(
        r"^notebook=01_dot_product_attention seconds=([\d.]+) budget_s=60 (within|OVER)$",
        out,
        re.MULTILINE,
    )
    assert line, out
    assert float(line.group(1)) > 0
    # Fewer than all of them: the total without the budget of all 15.
    assert re.search(r"^notebooks=1 seconds=[\d.]+ cores=\d+$", out, re.MULTILINE), out


def test_notebooks_benchmark_names_a_notebook_that_does_not_exist(capsys):
    assert bench.main(["notebooks", "--notebooks", "99_no_such_notebook"]) == 1
    assert "no solution notebook 99_no_such_notebook" in capsys.readouterr().out


def test_notebook_budgets_are_the_design_s():
    assert bench.notebook_budget("01_dot_product_attention") == 60
    assert bench.notebook_budget("11_gpt") == 90
    assert bench.notebook_budget("14_triton_attention") == 60


def _grade_output(rows: list[tuple[str, float, str, str]]) -> str:
    """make grade's progress lines and report for rows of (student, seconds, score, status)."""
    aid = "01_dot_product_attention"
    progress = "".join(
        f"   [{i + 1}/{len(rows)}] {aid} {s}: {status} ({sec:.1f} s)\n"
        for i, (s, sec, _, status) in enumerate(rows)
    )
    report = "".join(
        f"  {aid:32s} {s:20s} {score:>6s} / {'7.0':<6s} {status}\n" for s, _, score, status in rows
    )
    return f"{progress}\nGrading report\n{report}{len(rows)} submission(s) graded\n"


def test_the_semester_comparison_times_only_the_students_both_codes_graded_exactly():
    """Issue 39's budget compares two gradings of one class on the students both graded to
    the score they must get: a notebook the old code could not grade (a pasted image, a
    copied test cell) or graded wrong is left out of both sums, not counted as a fast one."""
    expected = {"ana": 7.0, "bo": 7.0, "cy": 5.0, "di": 0.0, "ed": 7.0}
    before = _grade_output(
        [
            ("ana", 20.0, "7.0", "graded"),
            ("bo", 2.0, "?", "failed"),
            ("cy", 18.0, "5.0", "graded"),
            ("di", 10.0, "7.0", "graded"),
            ("ed", 3.0, "", "not graded"),  # no score: the column is blank
        ]
    )
    after = _grade_output(
        [
            ("ana", 21.0, "7.0", "graded"),
            ("bo", 22.0, "7.0", "graded"),
            ("cy", 19.8, "5.0", "graded"),
            ("di", 9.0, "0.0", "graded"),
            ("ed", 20.0, "7.0", "graded"),
        ]
    )
    c = bench.semester_comparison(before, after, expected)
    assert c["both"] == ["ana", "cy"]
    assert (c["students"], c["exact_before"], c["exact_after"]) == (5, 2, 5)
    assert (c["before_s"], c["after_s"]) == pytest.approx((38.0, 40.8))
    assert c["ratio"] == pytest.approx(40.8 / 38.0)


def test_the_semester_comparison_names_a_commit_it_cannot_read(tmp_path):
    with pytest.raises(SystemExit, match="could not be read"):
        bench._tree_at("0" * 40, tmp_path / "tree")
