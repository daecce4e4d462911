"""A throwaway multi-user JupyterHub for tests/test_hub.py.

Real Unix accounts (one instructor, students, a course group), nbgrader's exchange on a
shared root with the permissions of the instructor guide ("Running the course on
JupyterHub"), JupyterHub on 127.0.0.1 with LocalProcessSpawner (each single-user server
runs as its Unix user), and a small client that works through the hub: the REST API with
per-user tokens, the contents API and code executed in each user's own kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COURSE_ID = "attention-from-scratch"
SITE = Path(sysconfig.get_paths()["purelib"])
SCRIPTS = {
    "alembic": "from alembic.config import main",
    "nbgrader": "from nbgrader.apps.nbgraderapp import main",
    "jupyter": "from jupyter_core.command import main",
}


def proxy_command() -> str | None:
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    try:
        prefix = subprocess.run(
            ["npm", "prefix", "-g"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    cand = Path(prefix) / "bin" / "configurable-http-proxy"
    return str(cand) if prefix and cand.exists() else None


def missing_requirements() -> list[str]:
    """Why a real hub cannot run here (empty when it can)."""
    why = []
    if sys.platform != "linux":
        why.append("Linux needed")
    elif os.geteuid() != 0:
        why.append("root needed (the test creates Unix accounts)")
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "runuser"):
        if shutil.which(tool) is None:
            why.append(f"{tool} not found")
    if shutil.which("node") is None and shutil.which("nodejs") is None:
        why.append("nodejs not found (apt-get install nodejs npm)")
    if proxy_command() is None:
        why.append("configurable-http-proxy not found (npm install -g configurable-http-proxy)")
    return why


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        msg = f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        raise RuntimeError(msg)
    return proc


def runnable_python(user: str, base: Path) -> tuple[str, str]:
    """An interpreter of this very Python that ``user`` can run. This venv's base
    interpreter may sit where other accounts cannot reach it (pyenv under /root, mode
    0700): then its files are linked (or copied) into ``base``, site-packages left out.
    Returns the interpreter and the LD_LIBRARY_PATH it needs ("" for none)."""
    exe = Path(sys._base_executable)
    if sh("runuser", "-u", user, "--", str(exe), "-c", "import sys", check=False).returncode == 0:
        return str(exe), ""
    src, dest = Path(sys.base_prefix), base / "python"
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for path in [exe, *(src / "lib").glob("libpython*"), *(src / "lib" / ver).rglob("*")]:
        rel = path.relative_to(src)
        if "site-packages" in rel.parts or path.is_dir():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    for d in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    (dest / "lib" / ver / "site-packages").mkdir(exist_ok=True)
    copy, lib = dest / exe.relative_to(src), str(dest / "lib")
    code = f"import sys; assert sys.version_info[:3] == {tuple(sys.version_info[:3])!r}"
    probe = sh(
        "runuser",
        "-u",
        user,
        "--",
        "env",
        f"LD_LIBRARY_PATH={lib}",
        str(copy),
        "-c",
        code,
        check=False,
    )
    if probe.returncode != 0:
        raise RuntimeError(f"{user} cannot run a copy of {exe}: {probe.stderr}")
    return str(copy), lib


@dataclass
class Account:
    name: str
    role: str  # "instructor" or "studentN"
    home: Path
    uid: int = 0
    token: str = ""


class UnresponsiveKernelError(RuntimeError):
    """A kernel's websocket closed twice with no answer to the request: the kernel never
    ran it."""


@dataclass
class _Reply:
    """What a kernel sends back for one execute request (``msg_id``)."""

    msg_id: str
    out: list[str] = field(default_factory=list)
    error: str | None = None
    replied: bool = False
    idle: bool = False
    seen: bool = False  # anything in reply to the request came back

    @property
    def done(self) -> bool:
        return self.replied and self.idle

    def take(self, raw) -> None:
        """Fold in one websocket message; messages for other requests are passed over."""
        if raw is None or isinstance(raw, bytes):
            return
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        self.seen = True
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            self.out.append(content["text"])
        elif kind == "error":
            self.error = "\n".join(content["traceback"])
        elif kind == "execute_reply":
            self.replied = True
        elif kind == "status" and content["execution_state"] == "idle":
            self.idle = True


@dataclass
class Hub:
    base: Path
    exchange: Path
    group: str
    instructor: Account
    students: list[Account]
    # Course members without a hub server: they act as their Unix account (runuser), as a
    # student's own kernel or terminal would, on the exchange's drop box.
    intruders: list[Account] = field(default_factory=list)
    envs: dict[str, Path] = field(default_factory=dict)
    ld_path: str = ""  # LD_LIBRARY_PATH for a linked copy of the interpreter
    # Folders above the checkout given o+x (traverse) for the test, with their old modes.
    opened: list[tuple[Path, int]] = field(default_factory=list)
    url: str = ""
    admin_token: str = ""
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def accounts(self) -> list[Account]:
        """The accounts with a server on the hub."""
        return [self.instructor, *self.students]

    def run_as(self, acct: Account, code: str, timeout: float = 120):
        """Run ``code`` with the students' Python as ``acct`` (no hub involved); it must
        ``print(json.dumps(result))`` last."""
        py = str(self.envs["student"] / "bin" / "python")
        env = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={acct.home}"]
        if self.ld_path:
            env.append(f"LD_LIBRARY_PATH={self.ld_path}")
        proc = sh("runuser", "-u", acct.name, "--", *env, py, "-c", code, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # ----------------------------------------------------------------- REST API
    def api(self, method: str, path: str, token: str, body=None, raw: bool = False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"token {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read().decode()[:500]}") from e
        return text if raw else (json.loads(text) if text else None)

    def start_servers(self, accts: list[Account], timeout: float = 120) -> None:
        """Ask the hub to start every one of ``accts``' servers, then wait until all are
        ready (they start side by side, as a class logging in does)."""
        for acct in accts:
            try:
                self.api("POST", f"/hub/api/users/{acct.name}/server", self.admin_token, {})
            except RuntimeError as e:
                if "400" not in str(e):  # 400: already running
                    raise
        waiting = list(accts)
        deadline = time.time() + timeout
        while waiting and time.time() < deadline:
            for acct in list(waiting):
                info = self.api("GET", f"/hub/api/users/{acct.name}", self.admin_token)
                if info.get("servers", {}).get("", {}).get("ready"):
                    waiting.remove(acct)
            if waiting:
                time.sleep(0.5)
        if waiting:
            names = ", ".join(a.name for a in waiting)
            raise RuntimeError(f"servers of {names} did not start; hub log:\n{self.tail()}")

    def server_pids(self, acct: Account) -> list[int]:
        """Processes of ``acct``'s single-user server (any jupyterhub-singleuser run by it)."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    uid = d.stat().st_uid
                except OSError:
                    continue
                if "jupyterhub.singleuser" in cmd and uid == acct.uid:
                    out.append(int(d.name))
        return out

    # ----------------------------------------------------------------- contents
    def get_notebook(self, acct: Account, path: str) -> dict:
        return self.api("GET", f"/user/{acct.name}/api/contents/{path}?content=1", acct.token)

    def put_notebook(self, acct: Account, path: str, nb: dict) -> None:
        body = {"type": "notebook", "format": "json", "content": nb}
        self.api("PUT", f"/user/{acct.name}/api/contents/{path}", acct.token, body)

    # ----------------------------------------------------------------- kernels
    def kernel(self, acct: Account) -> str:
        kernels = self.api("GET", f"/user/{acct.name}/api/kernels", acct.token)
        if kernels:
            return kernels[0]["id"]
        return self.api("POST", f"/user/{acct.name}/api/kernels", acct.token, {"name": "python3"})[
            "id"
        ]

    def run(
        self, acct: Account, code: str, timeout: float = 600, session: str | None = None
    ) -> str:
        """Execute ``code`` in ``acct``'s own kernel (through the hub's proxy); return its
        stdout. A Python error in the code raises RuntimeError with the traceback.
        ``session``: the websocket session's id (a new one by default)."""
        for attempt in range(2):
            kid = self.kernel(acct)
            try:
                return asyncio.run(
                    self._execute(acct, kid, code, timeout, session or uuid.uuid4().hex)
                )
            except UnresponsiveKernelError:
                # A kernel that never answered (seen on a loaded machine: no reply to
                # kernel_info for minutes) never ran the code: a new kernel runs it.
                if attempt:
                    raise
                self.api("DELETE", f"/user/{acct.name}/api/kernels/{kid}", acct.token)
        raise AssertionError("unreachable")

    def run_json(self, acct: Account, code: str, timeout: float = 600, session: str | None = None):
        """Execute ``code``, which must ``print(json.dumps(result))`` as its last line."""
        out = self.run(acct, code, timeout, session)
        return json.loads(out.strip().splitlines()[-1])

    async def _execute(
        self, acct: Account, kid: str, code: str, timeout: float, session: str
    ) -> str:
        """Send ``code`` once and collect its output and reply.

        The connection names the websocket ``session``. A loaded machine (CI runs notebooks
        beside this) has closed a kernel's websocket before the reply; jupyter_server keeps a
        session's messages while its websocket is away and sends them again to a websocket
        of the same session, so this reconnects (at most ``RECONNECTS`` times) and reads on.
        The request is sent again only when nothing in reply to it came back, on either
        connection: the kernel never saw it.
        """
        msg_id = uuid.uuid4().hex
        request = json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": acct.name,
                    "session": session,
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
                "channel": "shell",
                "buffers": [],
            }
        )
        reply = _Reply(msg_id)
        deadline = time.time() + timeout
        closed = []  # when each websocket closed before the reply: for the error message
        while not reply.done:
            if len(closed) >= 2 and not reply.seen:
                raise UnresponsiveKernelError(
                    f"{acct.name}'s kernel {kid} answered nothing in {closed[-1]} s; hub "
                    f"log:\n{self.tail()}"
                )
            if len(closed) > self.RECONNECTS:
                raise RuntimeError(
                    f"{acct.name}'s kernel websocket closed {len(closed)} times before the "
                    f"reply (at {closed} s); hub log:\n{self.tail()}"
                )
            conn = await self._connect(acct, kid, session, deadline)
            try:
                # After a reconnect, what the server kept for this session comes first.
                send_at, sent = time.time() + (5 if closed else 0), False
                while not reply.done:
                    now = time.time()
                    if not (reply.seen or sent) and now >= send_at:
                        conn.write_message(request)
                        sent = True
                    left = deadline - now
                    if left <= 0:
                        raise TimeoutError(f"code in {acct.name}'s kernel ran past {timeout} s")
                    waiting = reply.seen or sent
                    try:
                        raw = await asyncio.wait_for(
                            conn.read_message(), left if waiting else min(left, send_at - now)
                        )
                    except TimeoutError:
                        if waiting:
                            raise TimeoutError(
                                f"code in {acct.name}'s kernel ran past {timeout} s"
                            ) from None
                        continue
                    if raw is None:
                        closed.append(round(timeout - (deadline - time.time()), 1))
                        break
                    reply.take(raw)
            finally:
                conn.close()
        if reply.error:
            raise RuntimeError(f"in {acct.name}'s kernel:\n{''.join(reply.out)}\n{reply.error}")
        return "".join(reply.out)

    RECONNECTS = 3

    async def _connect(self, acct: Account, kid: str, session: str, deadline: float):
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        ws_url = self.url.replace("http://", "ws://")
        ws_url += f"/user/{acct.name}/api/kernels/{kid}/channels?session_id={session}"
        # The handshake waits for the kernel's first reply, which a loaded machine can take
        # longer than tornado's default 20 s to give.
        wait = max(1.0, min(deadline - time.time(), 180))
        req = HTTPRequest(
            ws_url,
            headers={"Authorization": f"token {acct.token}"},
            connect_timeout=wait,
            request_timeout=wait,
        )
        return await websocket_connect(req)

    def tail(self, n: int = 60) -> str:
        if self.log and self.log.exists():
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


# --------------------------------------------------------------------- setup/teardown
def create_accounts(base: Path, n_students: int = 3, intruders: tuple[str, ...] = ()) -> Hub:
    tag = secrets.token_hex(2)
    group = f"afs{tag}course"
    homes = base / "home"
    homes.mkdir(mode=0o755)
    sh("groupadd", group)
    hub = Hub(
        base=base,
        exchange=base / "srv" / "nbgrader" / "exchange",
        group=group,
        instructor=Account(f"afs{tag}inst", "instructor", homes / f"afs{tag}inst"),
        students=[
            Account(f"afs{tag}stu{i}", f"student{i}", homes / f"afs{tag}stu{i}")
            for i in range(1, n_students + 1)
        ],
        intruders=[Account(f"afs{tag}{r[:4]}", r, homes / f"afs{tag}{r[:4]}") for r in intruders],
    )
    try:
        _add_users(hub, group)
    except BaseException:
        remove_accounts(hub)
        raise
    return hub


def _add_users(hub: Hub, group: str) -> None:
    for acct in [*hub.accounts, *hub.intruders]:
        # -M + our own home: useradd's skeleton and HOME_MODE differ between distributions.
        sh("useradd", "-M", "-d", str(acct.home), "-s", "/bin/bash", "-G", group, acct.name)
        acct.uid = pwd.getpwnam(acct.name).pw_uid
        acct.home.mkdir(mode=0o700)
        os.chown(acct.home, acct.uid, pwd.getpwnam(acct.name).pw_gid)
        acct.home.chmod(0o700)  # guide: every home is private (mode 0700)


def remove_accounts(hub: Hub) -> None:
    uids = {a.uid for a in [*hub.accounts, *hub.intruders] if a.uid}
    for _ in range(3):  # only processes of the accounts the test created
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError):
                    if d.stat().st_uid in uids:
                        os.kill(int(d.name), 9)
        time.sleep(0.2)
    for acct in [*hub.accounts, *hub.intruders]:
        sh("userdel", acct.name, check=False)
    sh("groupdel", hub.group, check=False)


def make_exchange(hub: Hub) -> None:
    """The exchange of the instructor guide: a root anyone can write to (sticky, so no one
    removes another's course), and a course folder owned by the instructor, group the
    course's group, mode 2750: only the course's members enter it."""
    hub.exchange.parent.mkdir(parents=True, mode=0o755)
    hub.exchange.parent.parent.chmod(0o755)
    hub.exchange.mkdir(mode=0o777)
    hub.exchange.chmod(0o1777)
    course = hub.exchange / COURSE_ID
    course.mkdir()
    os.chown(course, hub.instructor.uid, grp.getgrnam(hub.group).gr_gid)
    course.chmod(0o2750)


def make_envs(hub: Hub) -> None:
    """Two Python environments sharing the course's dependencies (this venv's
    site-packages): the instructor's with the full package, the students' with the student
    edition in place of it."""
    py, hub.ld_path = runnable_python(hub.students[0].name, hub.base)
    run_env = dict(os.environ, LD_LIBRARY_PATH=hub.ld_path) if hub.ld_path else None

    def probe():
        return sh(
            "runuser", "-u", hub.students[0].name, "--", "env",
            f"LD_LIBRARY_PATH={hub.ld_path}", py, "-c",
            f"import sys; sys.path.append({str(SITE)!r}); import torch, nbgrader, jupyterhub",
            check=False,
        )  # fmt: skip

    if probe().returncode != 0:
        # A checkout under a private folder (/root, mode 0700): let other accounts pass
        # through (x, not r) the folders above it for the test; stop_hub restores them.
        for d in reversed(SITE.parents):
            mode = d.stat().st_mode & 0o7777
            if not mode & 0o001:
                hub.opened.append((d, mode))
                d.chmod(mode | 0o001)
    result = probe()
    if result.returncode != 0:
        raise RuntimeError(
            f"the course's dependencies in {SITE} are not readable by other accounts (every "
            "folder above the checkout needs o+rx, e.g. clone it under /srv or /tmp, not "
            f"/root):\n{result.stderr[-2000:]}"
        )
    for who in ("instructor", "student"):
        env = hub.base / "envs" / who
        sh(py, "-m", "venv", "--without-pip", str(env), env=run_env)
        site = next((env / "lib").glob("python3*/site-packages"))
        if who == "instructor":
            # addsitedir also runs this venv's .pth files: the editable attention_ref.
            (site / "course-deps.pth").write_text(f"import site; site.addsitedir({str(SITE)!r})\n")
        else:
            # A plain path: the dependencies, but not the editable (full) attention_ref.
            (site / "course-deps.pth").write_text(f"{SITE}\n")
            sh(sys.executable, "-m", "attention_ref.course.edition", "build", str(site), cwd=ROOT)
        # Console scripts the course's tools call by name (nbgrader runs `alembic`).
        for script, entry in SCRIPTS.items():
            exe = env / "bin" / script
            exe.write_text(f"#!{env}/bin/python\nimport sys\n{entry}\nsys.exit(main())\n")
            exe.chmod(0o755)
        hub.envs[who] = env
    for p in [hub.base / "envs", *(hub.base / "envs").rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)


def write_config(hub: Hub) -> Path:
    """jupyter config shared by every single-user server (the guide's /etc/jupyter) and
    the hub's own config."""
    etc = hub.base / "etc" / "jupyter"
    etc.mkdir(parents=True)
    for p in (hub.base / "etc", etc):
        p.chmod(0o755)
    (etc / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(hub.exchange)!r}\n"
    )
    (etc / "nbgrader_config.py").chmod(0o644)

    hubdir = hub.base / "hub"
    hubdir.mkdir(mode=0o700)
    hub.admin_token = secrets.token_hex(32)
    port, hub_port, api_port = free_port(), free_port(), free_port()
    hub.url = f"http://127.0.0.1:{port}"
    students = [a.name for a in hub.students]
    env_of = {a.name: str(hub.envs["student"]) for a in hub.students}
    env_of[hub.instructor.name] = str(hub.envs["instructor"])
    config = f"""
c = get_config()  # noqa: F821
c.JupyterHub.bind_url = {hub.url!r}
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy_command()!r}]
c.ConfigurableHTTPProxy.pid_file = {str(hubdir / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{hubdir / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = {str(hubdir / "cookie_secret")!r}
c.JupyterHub.cleanup_servers = True
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {secrets.token_hex(16)!r}
c.Authenticator.allowed_users = {set([hub.instructor.name, *students])!r}
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.ip = "127.0.0.1"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.default_url = "/lab"
ENV_OF = {env_of!r}
EXTRA_PATH = {os.environ.get("PATH", "")!r}


def pre_spawn_hook(spawner):
    env = ENV_OF[spawner.user.name]
    spawner.cmd = [env + "/bin/python", "-m", "jupyterhub.singleuser"]
    spawner.environment.update({{
        "PATH": env + "/bin:/usr/local/bin:/usr/bin:/bin",
        "JUPYTER_CONFIG_PATH": {str(etc)!r},
        # nbconvert's templates (generate_feedback) and kernelspecs of the shared deps
        "JUPYTER_PATH": {str(Path(sys.prefix) / "share" / "jupyter")!r},
        "OMP_NUM_THREADS": "1",
        **({{"LD_LIBRARY_PATH": {hub.ld_path!r}}} if {bool(hub.ld_path)!r} else {{}}),
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
    }})


c.Spawner.pre_spawn_hook = pre_spawn_hook
c.JupyterHub.services = [{{"name": "course-test", "api_token": {hub.admin_token!r}}}]
c.JupyterHub.load_roles = [
    {{
        "name": "course-test",
        "scopes": ["admin:users", "admin:servers", "tokens", "list:users"],
        "services": ["course-test"],
    }}
]
"""
    path = hubdir / "jupyterhub_config.py"
    path.write_text(config)
    return path


def start_hub(hub: Hub, config: Path, timeout: float = 90) -> None:
    hub.log = hub.base / "hub" / "hub.log"
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), str(Path(proxy_command()).parent), env.get("PATH", "")]
    )
    with open(hub.log, "w") as log:
        hub.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(config)],
            cwd=config.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if hub.process.poll() is not None:
            raise RuntimeError(f"jupyterhub exited ({hub.process.returncode}):\n{hub.tail()}")
        try:
            hub.api("GET", "/hub/api/", hub.admin_token)
            break
        except (RuntimeError, OSError):
            time.sleep(0.5)
    else:
        raise RuntimeError(f"jupyterhub did not answer in {timeout} s:\n{hub.tail()}")
    for acct in hub.accounts:
        acct.token = hub.api(
            "POST",
            f"/hub/api/users/{acct.name}/tokens",
            hub.admin_token,
            {"note": "course test", "expires_in": 3600},
        )["token"]


def stop_hub(hub: Hub) -> None:
    proc = hub.process
    if proc is not None and proc.poll() is None:
        proc.terminate()  # the hub stops the users' servers and its proxy (cleanup_servers)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    pidfile = hub.base / "hub" / "proxy.pid"
    if pidfile.exists():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text().strip()), 15)
    while hub.opened:  # the folders make_envs opened for traversal, as they were
        d, mode = hub.opened.pop()
        with contextlib.suppress(OSError):
            d.chmod(mode)


def new_base() -> Path:
    base = Path(tempfile.mkdtemp(prefix="afs-hub-", dir="/tmp"))
    base.chmod(0o755)  # the accounts' homes and the exchange live inside
    return base
