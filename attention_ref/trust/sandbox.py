"""The sandbox every graded notebook runs in.

Grading runs students' code, and a submission may be hostile. Each notebook that grading
executes (``make grade``, ``nbgrader autograde``, formgrader's autograde button, the
salvage run after a dead kernel) gets a kernel of its own, started inside a bubblewrap
sandbox (``bwrap``, the sandbox Flatpak uses) by :class:`SandboxKernelManager`. The
kernel sees:

- **read-only**: the system's programs and libraries (``/usr``, ``/lib``...), the Python
  environment grading runs in (the virtual environment and the interpreter it was made
  from), and the course package as the **grading edition** of the notebook graded
  (bytecode, no readable reference sources, no later notebook's answers and no model of
  the checks': :mod:`attention_ref.course.edition`), first on its import path;
- **writable**: ``/tmp`` (a tmpfs of :attr:`Caps.disk` bytes), holding its working
  folder ``/tmp/work`` (a copy of the submission's notebook and nothing else, so no
  submitted module can shadow one the notebook imports) and the folder of its sockets;
- **nothing else**: not the course root (solutions, submissions, the gradebook, feedback),
  not the exchange, not home folders, not the installed package's sources, not /etc's
  secrets; no network (a network namespace of its own: the kernel talks to the grader
  over Unix sockets, Jupyter's ``ipc`` transport, in a folder of its own); no other
  process (a PID namespace of its own); an environment with only what grading needs (no
  credentials, tokens or database URLs).

Every process the kernel starts ends when the kernel ends: the kernel is the first
process of its PID namespace's init, and bwrap kills it when the grader goes away.

Caps (:class:`Caps`, from the environment or nbgrader_config.py): memory (address space,
``RLIMIT_AS``), processes and threads (``RLIMIT_NPROC``, counted in the sandbox's own
user namespace; when grading runs as root the kernel runs under a user id of its own),
and bytes written (the size of the tmpfs).

Where the sandbox cannot start (no ``bwrap``, user namespaces disabled, not Linux),
grading refuses with a message that says why, unless ``ATTENTION_REF_SANDBOX=off``.

This module imports nothing from the course package (nbgrader_config.py loads it by file
path, without importing PyTorch). Run as a script, it is the launcher inside the sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SWITCH = "ATTENTION_REF_SANDBOX"  # "off": grade without a sandbox (documented opt-out)
EDITION_ENV = "ATTENTION_REF_SANDBOX_PACKAGE"  # a built student edition to use
GRADED_EDITIONS = "graded"  # its folder of grading editions (course/edition.py's GRADED)
#: "off": every kernel gets the student edition, no answer withheld (the grader's setting,
#: to measure what the grading editions cost: python -m attention_ref.bench grading).
EDITIONS_SWITCH = "ATTENTION_REF_GRADING_EDITIONS"
CAP_ENV = {
    "memory": "ATTENTION_REF_SANDBOX_MEMORY",
    "processes": "ATTENTION_REF_SANDBOX_PROCESSES",
    "disk": "ATTENTION_REF_SANDBOX_DISK",
}
#: Defaults for a 2-core, 8 GB grading machine grading two submissions at a time: graded,
#: the course's heaviest notebooks (08, 11) peak at 1.7 GiB of address space (under
#: 0.5 GiB resident) and 17 threads.
DEFAULT_CAPS = {"memory": "3G", "processes": "128", "disk": "512M"}
#: Environment variables a graded kernel keeps (everything else is dropped; never the
#: grading secret, trust/secret.py).
KEEP_ENV = re.compile(
    r"^(NBGRADER_EXECUTION|PYTHONHASHSEED|OMP_NUM_THREADS|MKL_NUM_THREADS|"
    r"OPENBLAS_NUM_THREADS|MPLBACKEND|LD_LIBRARY_PATH|"
    r"ATTENTION_REF_(?!SANDBOX|GRADING_SECRET$)[A-Z0-9_]+)$"
)
#: Inside the sandbox.
SANDBOX = "/tmp"  # the one writable folder, a tmpfs (environments may be bound inside)
WORK = f"{SANDBOX}/work"
RUN = f"{SANDBOX}/.kernel"  # the kernel's Unix sockets
CONNECTION_FILE = "/opt/kernel.json"
PACKAGE_DIR = "/opt/course-package"
LAUNCHER = "/opt/course-launcher.py"
CHECKER_SOCKET = "/opt/checker.sock"  # the trusted checker's (attention_ref.trust.trusted)
# The user id a kernel gets when grading runs as root: one of its own, so that the
# process cap counts its processes alone.
ROOT_UID_BASE, ROOT_UID_SPAN = 1_500_000_000, 500_000_000


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot start here; the message says why and what to do."""


def _parse_size(name: str, raw: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", raw)
    if not m:
        raise ValueError(f"{name} must be a size such as 3G, 512M or 1048576; got {raw!r}")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Caps:
    """What one graded notebook may use: ``memory`` (bytes of address space),
    ``processes`` (processes and threads at once), ``disk`` (bytes written)."""

    memory: int
    processes: int
    disk: int

    @classmethod
    def from_env(cls) -> Caps:
        values = {k: os.environ.get(v, "").strip() or DEFAULT_CAPS[k] for k, v in CAP_ENV.items()}
        processes = values["processes"]
        if not processes.isdigit() or int(processes) < 16:
            raise ValueError(
                f"{CAP_ENV['processes']} must be a whole number of at least 16 (a kernel "
                f"runs about 15 threads); got {processes!r}"
            )
        memory = _parse_size(CAP_ENV["memory"], values["memory"])
        if memory < 2**30:
            raise ValueError(
                f"{CAP_ENV['memory']} must be at least 1G (a kernel with PyTorch needs "
                f"about 0.8 GiB of address space, the course's notebooks up to 1.7 GiB); "
                f"got {values['memory']!r}"
            )
        disk = _parse_size(CAP_ENV["disk"], values["disk"])
        if disk < 2**20:
            raise ValueError(f"{CAP_ENV['disk']} must be at least 1M; got {values['disk']!r}")
        return cls(memory=memory, processes=int(processes), disk=disk)

    def describe(self) -> str:
        return (
            f"memory {_fmt_size(self.memory)}, {self.processes} processes and threads, "
            f"{_fmt_size(self.disk)} written"
        )


def enabled() -> bool:
    """Whether grading sandboxes its kernels (``ATTENTION_REF_SANDBOX`` is not ``off``)."""
    raw = os.environ.get(SWITCH, "on").strip().lower()
    if raw not in ("on", "off", ""):
        raise ValueError(f"{SWITCH} must be 'on' (the default) or 'off'; got {raw!r}")
    return raw != "off"


UNSANDBOXED_WARNING = (
    f"WARNING: UNSANDBOXED GRADING ({SWITCH}=off): the submissions ran with the grader's "
    "rights and could read, write and send anything the grader can."
)

_PROBED: dict[str, str | None] = {}


def unavailable_reason() -> str | None:
    """None when a sandbox starts here; otherwise why not and how to fix it."""
    if "reason" in _PROBED:
        return _PROBED["reason"]
    fix = (
        f"Grading runs students' code and refuses to run it unsandboxed. Fix it, or set "
        f"{SWITCH}=off to grade WITHOUT a sandbox (trusted submissions only)."
    )
    reason = None
    if not sys.platform.startswith("linux"):
        reason = f"the grading sandbox needs Linux (this is {sys.platform}). {fix}"
    elif shutil.which("bwrap") is None:
        reason = (
            "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` on Debian or "
            f"Ubuntu, `dnf install bubblewrap` on Fedora. {fix}"
        )
    else:
        argv = ["bwrap", *_namespaces(), "--ro-bind", "/", "/", "--proc", "/proc"]
        argv += ["--dev", "/dev", "--die-with-parent", "--", "true"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            reason = (
                f"bwrap could not start a sandbox: {proc.stderr.strip() or proc.returncode}. "
                "It needs unprivileged user namespaces (sysctl "
                "kernel.unprivileged_userns_clone=1 on Debian and Ubuntu; on Ubuntu 24.04 "
                "and later also an AppArmor profile for bwrap, or "
                "kernel.apparmor_restrict_unprivileged_userns=0), or grading as root. "
                f"{fix}"
            )
    _PROBED["reason"] = reason
    return reason


def _namespaces() -> list[str]:
    spaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    spaces += ["--unshare-cgroup-try"]
    # As root bwrap needs no user namespace, and the kernel gets a user id of its own
    # (the launcher switches to it); otherwise the sandbox is a user namespace.
    return spaces if os.geteuid() == 0 else ["--unshare-user", *spaces]


# ----------------------------------------------------------------------------- the package
def _package_source() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("attention_ref")  # finds it without importing it
    if spec is None or not spec.origin:
        raise SandboxUnavailableError("the course package attention_ref is not installed")
    return Path(spec.origin).resolve().parent


def _source_digest(src: Path) -> str:
    h = hashlib.sha256(sys.version.encode())
    for p in sorted(src.rglob("*.py")):
        h.update(str(p.relative_to(src)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def student_edition() -> Path:
    """A folder holding the student edition of the installed package and each notebook's
    grading edition (built once per version of its sources, in the user's cache), for the
    sandbox's import path: :func:`edition_for` picks the one a kernel gets."""
    given = os.environ.get(EDITION_ENV)
    if given:
        if not (Path(given) / "attention_ref" / "__init__.pyc").is_file():
            raise SandboxUnavailableError(
                f"{EDITION_ENV}={given} holds no student edition (attention_ref/__init__.pyc)"
            )
        if not (Path(given) / GRADED_EDITIONS).is_dir():
            raise SandboxUnavailableError(
                f"{EDITION_ENV}={given} holds no grading editions ({GRADED_EDITIONS}/): build "
                "them with python -m attention_ref.course.edition build-grading DIR"
            )
        return Path(given)
    src = _package_source()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    dest = cache / "attention_ref" / f"grading-editions-{_source_digest(src)}"
    if (dest / GRADED_EDITIONS).is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=dest.parent))
    proc = subprocess.run(
        [sys.executable, "-m", "attention_ref.course.edition", "build-grading", str(tmp)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SandboxUnavailableError(f"could not build the student edition:\n{proc.stderr}")
    tmp.chmod(0o755)
    try:
        tmp.rename(dest)
    except OSError:  # another worker built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def edition_for(editions: Path, folder: Path) -> Path:
    """The edition a kernel grading the notebooks of ``folder`` gets: for the course's
    assignment ``NN_name``, notebook NN's grading edition (no later notebook's answers),
    where one was built; otherwise (an instructor's own assignment, or
    ``ATTENTION_REF_GRADING_EDITIONS=off``) the student edition."""
    found = re.match(r"(\d\d)_", Path(folder).name)
    if found and os.environ.get(EDITIONS_SWITCH) != "off":
        graded = editions / GRADED_EDITIONS / found.group(1)
        if (graded / "attention_ref" / "__init__.pyc").is_file():
            return graded
    return editions


# ----------------------------------------------------------------------------- bwrap
def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _environment_paths() -> list[Path]:
    """The Python environment: the virtual environment, its base interpreter, the
    site-packages folders on the import path outside them (a .pth file may add another
    environment's), and the folders on LD_LIBRARY_PATH; never a course folder, the
    working folder, a checkout of the package, or a folder that holds any of them. An
    import-path folder that is no site-packages (a script's folder, /tmp...) is not bound."""
    prefixes = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    prefixes.add(Path(os.path.realpath(sys.executable)).parent.parent)
    prefixes = {p.resolve() for p in prefixes}
    private = [Path.cwd().resolve(), Path(tempfile.gettempdir()).resolve()]
    src = _package_source()
    if not _inside(src, list(prefixes)):  # a checkout (editable install), not site-packages
        private.append(src.parent)
    paths = set(prefixes)
    site = [p for p in map(Path, filter(None, sys.path)) if _is_site(p)]
    libs = [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    for p in (q.resolve() for q in [*site, *libs]):
        if not p.is_dir() or _is_course(p) or any(_inside(q, [p]) for q in private):
            continue
        # Inside a private folder, only a virtual environment's folders are environment.
        if not _inside(p, private) or any((a / "pyvenv.cfg").is_file() for a in p.parents):
            paths.add(p)
    # Bind the outermost only: a folder inside another one is bound with it.
    return sorted(p for p in paths if not any(q != p and q in p.parents for q in paths))


def _is_site(p: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in p.parts)


def _is_course(p: Path) -> bool:
    return (p / "nbgrader_config.py").exists() or (p / "solutions").is_dir()


SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
#: Folders masked wherever they fall inside what the sandbox binds: nbgrader's default
#: exchange, the system-wide Jupyter and JupyterHub configuration.
NEVER_SHOWN = (
    Path("/usr/local/share/nbgrader"),
    Path("/usr/local/etc"),
    Path(sys.prefix) / "etc" / "jupyter",
    Path(sys.prefix) / "etc" / "jupyterhub",
)


def bwrap_argv(
    command: list[str],
    *,
    connection_file: Path,
    notebooks: list[Path],
    env: dict[str, str],
    caps: Caps,
    package: Path,
    hide: list[Path],
    uid: int | None = None,
    checker: Path | None = None,
) -> list[str]:
    """The command line that runs ``command`` (a kernel) in a sandbox.

    ``connection_file`` (the kernel's view: its sockets in :data:`RUN`) and ``notebooks``
    are copied in read-only; ``hide`` are folders to mask with an empty tmpfs wherever
    they fall inside what is bound (the course root, the exchange...)."""
    argv = ["bwrap", *_namespaces(), "--die-with-parent", "--new-session"]
    argv += ["--hostname", "sandbox", "--clearenv"]
    # Everything the kernel can write is in one tmpfs of caps.disk bytes, /tmp: its
    # working folder, the folder of its sockets, its scratch space.
    argv += ["--perms", "1777", "--size", str(caps.disk), "--tmpfs", SANDBOX]
    for d in (WORK, RUN):
        argv += ["--perms", "1777", "--dir", d]
    bound: list[Path] = []
    for p in SYSTEM:
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            argv += ["--ro-bind", p, p]
            bound.append(Path(p))
    for name in ETC:
        if os.path.exists(f"/etc/{name}"):
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    made: set[Path] = set()
    for p in _environment_paths():
        if not _inside(p, bound):
            # Folders bwrap makes on the way are private to root: open them to the kernel.
            for parent in reversed(p.parents[:-1]):
                if parent not in made and not _inside(parent, bound):
                    argv += ["--perms", "0755", "--dir", str(parent)]
                    made.add(parent)
            argv += ["--ro-bind", str(p), str(p)]
            bound.append(p)
    for p in sorted({h.resolve() for h in hide}):
        if _inside(p, bound) and p.is_dir():
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", str(p)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for nb in notebooks:
        argv += ["--ro-bind", str(nb), f"{WORK}/{nb.name}"]
    argv += ["--perms", "0755", "--dir", "/opt"]
    argv += ["--ro-bind", str(connection_file), CONNECTION_FILE]
    argv += ["--ro-bind", str(package), PACKAGE_DIR]
    if checker is not None:  # the trusted checker's socket, the one way out of the sandbox
        argv += ["--ro-bind", str(checker), CHECKER_SOCKET]
        argv += ["--setenv", "ATTENTION_REF_CHECKER", CHECKER_SOCKET]
    argv += ["--ro-bind", str(Path(__file__).resolve()), LAUNCHER, "--chdir", WORK]
    for k, v in sorted(env.items()):
        argv += ["--setenv", k, v]
    launch = [sys.executable, "-s", "-P", LAUNCHER, "--memory", str(caps.memory)]
    launch += ["--processes", str(caps.processes), "--disk", str(caps.disk)]
    if uid is not None:
        launch += ["--uid", str(uid)]
    return argv + ["--", *launch, "--", *command]


def kernel_env(parent: dict[str, str]) -> dict[str, str]:
    """The environment of a graded kernel: what grading needs, nothing secret."""
    env = {k: v for k, v in parent.items() if KEEP_ENV.match(k)}
    bindir = os.path.dirname(sys.executable)
    env.update(
        PATH=f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        HOME=SANDBOX,
        TMPDIR=SANDBOX,
        USER="student",
        LOGNAME="student",
        LANG="C.UTF-8",
        PYTHONPATH=PACKAGE_DIR,
        PYTHONDONTWRITEBYTECODE="1",
        MPLCONFIGDIR=f"{SANDBOX}/.matplotlib",
        MPLBACKEND=parent.get("MPLBACKEND", "module://matplotlib_inline.backend_inline"),
        ATTENTION_REF_SANDBOXED="1",
    )
    return env


def _course_root(start: Path) -> Path | None:
    """The course root above ``start`` (the folder with nbgrader_config.py), if any."""
    for p in (start, *start.parents):
        if (p / "nbgrader_config.py").is_file():
            return p
    return None


def _copy_notebooks(src_dir: Path, dest: Path) -> list[Path]:
    """Copies of the notebooks (regular files only, never through a link) in ``src_dir``."""
    out = []
    if not src_dir.is_dir():
        return out
    for p in sorted(src_dir.iterdir()):
        if p.suffix == ".ipynb" and not p.is_symlink() and p.is_file():
            target = dest / p.name
            with open(p, "rb") as f_in, open(target, "wb") as f_out:
                shutil.copyfileobj(f_in, f_out)
            target.chmod(0o644)
            out.append(target)
    return out


# ----------------------------------------------------------------------------- kernels
def pin_sockets(pid: int, ports: list[int], pins: Path) -> list[int]:
    """Open the kernel's socket files ``RUN/k-PORT`` inside the sandbox of ``pid`` (its
    root, seen from here) with ``O_PATH | O_NOFOLLOW`` at every step below that root, check
    each is a socket, and make ``pins/k-PORT`` a link to ``/proc/self/fd/N``: connecting
    there reaches the socket opened, whatever the kernel does to its names later. Returns
    the descriptors (held until the kernel is cleaned up). ``FileNotFoundError`` while the
    kernel has not made them all yet; ``SandboxUnavailableError`` for a name that is not a
    socket (a link, a file)."""
    import stat

    flags = os.O_PATH | os.O_NOFOLLOW
    opened: list[int] = []
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY)
        opened.append(root)
        here = root
        for part in Path(RUN).parts[1:]:
            here = os.open(part, flags | os.O_DIRECTORY, dir_fd=here)
            opened.append(here)
        fds = []
        for port in ports:
            fd = os.open(f"k-{port}", flags, dir_fd=here)
            opened.append(fd)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise SandboxUnavailableError(
                    f"the kernel's k-{port} is not a socket: refusing to connect to it"
                )
            fds.append(fd)
    except BaseException:
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    for fd in opened:
        if fd not in fds:
            os.close(fd)
    for port, fd in zip(ports, fds, strict=True):
        link = pins / f"k-{port}"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(f"/proc/self/fd/{fd}")
    return fds


RUN_PREFIX = "ar-sb-"  # a kernel's folder of the grader's (its connection, its notebooks)
OWNER_FILE = "owner"  # in it: the grading process's pid and start time


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is none: a
    pid with another start time is another process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int, started: str) -> bool:
    """Whether process ``pid``, started at ``started``, still runs (without /proc to tell
    the start time, ``started`` is "None" and a process of that pid counts)."""
    if started == "None":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # another user's process of that pid
        return True
    return _started(pid) == started


def _new_run_dir() -> Path:
    """A folder for one kernel (:func:`new_marked_dir`)."""
    return new_marked_dir(RUN_PREFIX)


def new_marked_dir(prefix: str, parent: str | os.PathLike | None = None) -> Path:
    """A new folder named ``prefix...`` in ``parent`` (the temporary folder), marked with
    the process that owns it; first, the folders of that prefix whose process is gone
    (killed, as a worker may be, before it could clean up) are removed: they may hold a copy
    of a student's notebook. Kernel folders and grading jobs' folders are made so."""
    sweep_orphans(Path(parent) if parent else None, prefix=prefix)
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (run_dir / OWNER_FILE).write_text(f"{os.getpid()} {_started(os.getpid())}")
    return run_dir


def sweep_orphans(
    parent: Path | None = None, unmarked_after: float = 3600.0, prefix: str = RUN_PREFIX
) -> list[Path]:
    """Remove this user's folders named ``prefix...`` (kernel folders by default) in
    ``parent`` (the temporary folder) whose owner process has ended; an unmarked one (from
    before the mark, or being made) once it is ``unmarked_after`` seconds old. The folders
    removed."""
    removed = []
    for d in Path(parent or tempfile.gettempdir()).glob(f"{prefix}*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.geteuid():
                continue
            owner = d / OWNER_FILE
            if owner.exists():
                pid, started = owner.read_text().split()
                if _alive(int(pid), started):
                    continue  # its grader is still running
            elif time.time() - d.stat().st_mtime < unmarked_after:
                continue
            shutil.rmtree(d)
            removed.append(d)
    return removed


def kernel_manager_class():
    """The sandboxed kernel manager (imported lazily: the launcher needs no jupyter)."""
    from jupyter_client.manager import AsyncKernelManager

    class SandboxKernelManager(AsyncKernelManager):
        """A kernel in its own sandbox (see :mod:`attention_ref.trust.sandbox`),
        talking to the grader over Unix sockets; interrupted by a message (a signal would
        reach bwrap, not the kernel)."""

        #: The trusted checker's socket (set by the grader before the kernel starts).
        checker_socket: str | None = None

        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            super().__init__(**kwargs)

        async def _async_pre_start_kernel(self, **kw):
            # A folder of the grader's for this kernel: its connection file, and the
            # kernel's view of it and of its notebooks, copied in at launch.
            self._run_dir = _new_run_dir()
            self.ip = str(self._run_dir / "k")
            self.connection_file = str(self._run_dir / "kernel.json")
            return await super()._async_pre_start_kernel(**kw)

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            if self.transport != "ipc":
                raise SandboxUnavailableError("a sandboxed kernel talks over ipc only")
            reason = unavailable_reason()
            if reason:
                raise SandboxUnavailableError(reason)
            self.kernel_spec.interrupt_mode = "message"
            cwd = Path(kw.pop("cwd", None) or os.getcwd())
            # The kernel's view of the connection: its sockets in RUN, inside the sandbox.
            info = json.loads(Path(self.connection_file).read_text())
            info["ip"] = f"{RUN}/k"
            view = self._run_dir / "kernel-view.json"
            view.write_text(json.dumps(info))
            view.chmod(0o644)
            work = self._run_dir / "notebooks"
            work.mkdir(exist_ok=True)
            work.chmod(0o755)
            self._run_dir.chmod(0o755)  # the kernel-view file and notebook copies
            cmd = [CONNECTION_FILE if a == self.connection_file else a for a in kernel_cmd]
            if cmd[1:3] == ["-m", "ipykernel_launcher"]:
                cmd[1:1] = ["-s", "-P"]  # no user site, no working folder on sys.path
            hide = [cwd, Path.home(), _package_source(), *NEVER_SHOWN]
            hide += [r for r in (_course_root(cwd), _course_root(Path.cwd())) if r]
            exchange = self.config.get("Exchange", {}).get("root")
            if isinstance(exchange, str) and exchange:
                hide.append(Path(exchange))
            uid = None
            if os.geteuid() == 0:
                import secrets

                uid = ROOT_UID_BASE + secrets.randbelow(ROOT_UID_SPAN)
            kw["env"] = {}
            kw["cwd"] = str(self._run_dir)
            # bwrap's and the launcher's own errors (the kernel's stderr goes nowhere).
            self._log = self._run_dir / "sandbox.log"
            kw["stderr"] = open(self._log, "wb")  # noqa: SIM115 - the kernel holds it
            argv = bwrap_argv(
                cmd,
                connection_file=view,
                notebooks=_copy_notebooks(cwd, work),
                env=kernel_env(dict(os.environ)),
                caps=Caps.from_env(),
                package=edition_for(student_edition(), cwd),
                hide=hide,
                uid=uid,
                checker=Path(self.checker_socket) if self.checker_socket else None,
            )
            try:
                await super()._async_launch_kernel(argv, **kw)
            finally:
                kw["stderr"].close()  # bwrap holds its own copy
            # The grader reaches the kernel's sockets through links of its own to file
            # descriptors it holds, opened once inside the sandbox's root without following
            # any link: a kernel that later swaps its socket files for links (to a socket
            # of the host, say) is never followed, even when the grader reconnects.
            self.ip = await self._pin_sockets(self._sandbox_pid())

        async def _pin_sockets(self, pid: int) -> str:
            import asyncio

            self._unpin()
            ports = [self.shell_port, self.iopub_port, self.stdin_port]
            ports += [self.control_port, self.hb_port]
            pins = self._run_dir / "pins"
            pins.mkdir(mode=0o700, exist_ok=True)
            deadline = time.monotonic() + 60
            while True:
                try:
                    self._pinned = pin_sockets(pid, ports, pins)
                    return str(pins / "k")
                except FileNotFoundError:  # the kernel has not bound them all yet
                    if time.monotonic() > deadline or self.provisioner.process.poll() is not None:
                        raise SandboxUnavailableError(
                            "the sandboxed kernel did not open its sockets"
                        ) from None
                    await asyncio.sleep(0.05)

        def _unpin(self) -> None:
            for fd in getattr(self, "_pinned", []):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pinned = []

        def _sandbox_pid(self) -> int:
            """The pid (here) of the first process inside the sandbox: bwrap's child."""
            pid = self.provisioner.process.pid
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                except OSError:
                    children = []
                if children:
                    return int(children[0])
                if self.provisioner.process.poll() is not None:
                    why = self._log.read_text(errors="replace")[-2000:].strip()
                    raise SandboxUnavailableError(
                        f"the sandbox exited before the kernel started: {why or 'no message'}"
                    )
                time.sleep(0.01)
            raise SandboxUnavailableError("the sandbox did not start within 30 s")

        def cleanup_connection_file(self) -> None:
            # Called whenever the kernel is cleaned up for good (not on a restart).
            super().cleanup_connection_file()
            self._unpin()
            shutil.rmtree(self._run_dir, ignore_errors=True)

    return SandboxKernelManager


# ----------------------------------------------------------------------------- launcher
def _launch(argv: list[str]) -> None:  # runs inside the sandbox, before the kernel
    import resource

    sep = argv.index("--")
    opts = dict(zip(argv[:sep:2], argv[1:sep:2], strict=True))
    command = argv[sep + 1 :]
    caps = {
        resource.RLIMIT_AS: int(opts["--memory"]),
        resource.RLIMIT_NPROC: int(opts["--processes"]),
        resource.RLIMIT_FSIZE: int(opts["--disk"]),
        resource.RLIMIT_CORE: 0,
    }
    for which, value in caps.items():
        resource.setrlimit(which, (value, value))
    if "--uid" in opts:  # grading as root: the kernel gets a user id of its own
        uid = int(opts["--uid"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    status = Path("/proc/self/status").read_text()
    caps_left = re.findall(r"^Cap(?:Inh|Prm|Eff|Amb):\s*([0-9a-f]+)$", status, re.M)
    if any(int(c, 16) for c in caps_left) or os.geteuid() == 0:
        sys.exit("sandbox: the kernel would keep privileges; refusing to start it")
    os.makedirs(os.environ.get("MPLCONFIGDIR", "/tmp/matplotlib"), exist_ok=True)
    devnull = os.open(os.devnull, os.O_RDWR)  # the kernel's banner is nobody's business,
    for fd in (0, 1, 2):  # and its stderr must not grow a file outside the sandbox
        os.dup2(devnull, fd)
    os.execv(command[0], command)


if __name__ == "__main__":
    _launch(sys.argv[1:])
