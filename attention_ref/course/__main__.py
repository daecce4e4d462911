"""``python -m attention_ref.course``: the command line behind ``make release``,
``make grade`` and ``make report`` (see :mod:`attention_ref.course`)."""

from __future__ import annotations

import argparse
import os
import sys

from . import __doc__ as course_doc
from .plumbing import course_root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attention_ref.course",
        description=course_doc.split("Run them from")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_rel = sub.add_parser("release", help="regenerate notebooks/ from solutions/")
    p_rel.add_argument("assignments", nargs="*")
    p_grade = sub.add_parser("grade", help="autograde submitted/ and export grades.csv")
    p_grade.add_argument("assignments", nargs="*")
    p_grade.add_argument("--csv", default="grades.csv", help="where to export the grades")
    p_grade.add_argument(
        "--force", action="store_true", help="regrade submissions that were graded before"
    )
    p_grade.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="submissions graded at a time (default: the number of cores)",
    )
    p_grade.add_argument(
        "--scheduler",
        default=None,
        help="grade on the Dask cluster of this scheduler (tls://host:8786; default: "
        "ATTENTION_REF_SCHEDULER, else a local cluster of --jobs workers)",
    )
    p_grade.add_argument(
        "--allow-plaintext-scheduler",
        action="store_true",
        help="accept a scheduler address that is not tls:// (a network only you can reach)",
    )
    p_rep = sub.add_parser(
        "report",
        help="the class report (HTML and CSV) and the grades for Canvas and Moodle",
    )
    p_rep.add_argument("assignments", nargs="*")
    p_rep.add_argument(
        "--out",
        default="report",
        help="the folder to write (default: report): class/, instructor/ and lms/ in it",
    )
    p_rep.add_argument(
        "--names", action="store_true", help="name the students (by default none is named)"
    )
    p_sim = sub.add_parser(
        "similarity",
        help="answers similar between submissions, a list to look at (no gradebook needed)",
    )
    p_sim.add_argument("assignments", nargs="*")
    p_sim.add_argument(
        "--out",
        default="report",
        help="the report's folder (default: report): writes its instructor/",
    )
    p_sim.add_argument(
        "--names", action="store_true", help="name the students (by default none is named)"
    )
    args = parser.parse_args(argv)
    root = course_root()
    if args.command == "release":
        from .release import release  # noqa: PLC0415 - each command imports what it needs

        release(root, args.assignments)
        return 0
    if args.command == "report":
        from .report import report  # noqa: PLC0415

        report(root, args.assignments, out_dir=args.out, names=args.names)
        return 0
    if args.command == "similarity":
        from .plumbing import assignments  # noqa: PLC0415
        from .report import INSTRUCTOR_FOLDER  # noqa: PLC0415
        from .similarity import write_similarity  # noqa: PLC0415

        unknown = sorted(set(args.assignments) - set(assignments(root)))
        if unknown:
            raise SystemExit(f"error: no assignment {', '.join(unknown)} in solutions/")
        out = root / args.out / INSTRUCTOR_FOLDER
        for p in write_similarity(root, args.assignments or assignments(root), out, args.names):
            print(f"wrote {p}")
        return 0
    from .cluster import PLAINTEXT_ENV, SCHEDULER_ENV  # noqa: PLC0415
    from .grading import grade  # noqa: PLC0415

    if args.scheduler:
        os.environ[SCHEDULER_ENV] = args.scheduler
    if args.allow_plaintext_scheduler:
        os.environ[PLAINTEXT_ENV] = "1"

    return grade(root, args.assignments, csv_path=args.csv, force=args.force, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
