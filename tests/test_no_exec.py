"""No new program from a graded kernel (attention_ref/trust/no_exec.py): after
forbid_new_programs, no thread of the process (those started before included) and no
forked child can run a program, and nothing else a notebook does changes. Which notebooks
get it is trust/trusted.py's; that a forger who asks another Python for the answer scores
what the wrong answer scores is tests/test_forgery.py's ("new-process")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attention_ref.trust import no_exec, trusted

PROBE = r"""
import os, queue, subprocess, sys, threading
import numpy as np, torch
asks, answers = queue.Queue(), queue.Queue()
def serve():  # a thread started before the filter
    while True:
        asks.get()
        try:
            subprocess.run(["true"])
            answers.put("ran")
        except PermissionError:
            answers.put("refused")
threading.Thread(target=serve, daemon=True).start()
from attention_ref.trust.no_exec import forbid_new_programs
print("installed", forbid_new_programs())
def system():  # the shell's child cannot run: a failure status, not an exception
    if os.system("true") != 0:
        raise PermissionError
for name, start in [
    ("subprocess", lambda: subprocess.run([sys.executable, "-c", "pass"])),
    ("os.system", system),
    ("execv", lambda: os.execv("/bin/true", ["true"])),
    ("posix_spawn", lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)),
]:
    try:
        start()
        print(name, "ran")
    except PermissionError:
        print(name, "refused")
asks.put(1)
print("earlier thread", answers.get())
pid = os.fork()  # allowed: the child is this kernel, and cannot run a program either
if pid == 0:
    try:
        os.execv("/bin/true", ["true"])
    except PermissionError:
        os._exit(3)
    os._exit(0)
print("forked child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
# Installing it again is harmless; nothing else changed.
print("again", forbid_new_programs())
print("compute", float(torch.softmax(torch.ones(4), 0).sum()), float(np.ones(3).sum()))
"""


def test_after_the_filter_no_thread_or_child_starts_a_program():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines == [
        "installed True",
        "subprocess refused",
        "os.system refused",
        "execv refused",
        "posix_spawn refused",
        "earlier thread refused",
        "forked child 3",
        "again True",
        "compute 1.0 3.0",
    ], out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize("machine", sorted(no_exec.SYSCALLS))
def test_the_filter_refuses_exactly_execve_execveat_and_other_abis(machine):
    arch, execve, execveat, _ = no_exec.SYSCALLS[machine]
    prog = no_exec.program(machine)

    def verdict(call_arch: int, nr: int) -> int:
        """Run the classic BPF program on one system call, as the kernel does."""
        pc, acc = 0, 0
        while True:
            code, jt, jf, k = prog[pc]
            if code == no_exec._LD_W_ABS:
                acc = call_arch if k == no_exec._ARCH else nr
                pc += 1
            elif code == no_exec._JEQ_K:
                pc += 1 + (jt if acc == k else jf)
            elif code == no_exec._JGE_K:
                pc += 1 + (jt if acc >= k else jf)
            else:
                assert code == no_exec._RET_K
                return k

    refuse, allow = no_exec._REFUSE, no_exec._ALLOW
    assert verdict(arch, execve) == refuse and verdict(arch, execveat) == refuse
    assert all(verdict(arch, nr) == allow for nr in (0, 1, 56, 57, 435))  # read, write, ...
    assert verdict(0x40000003, 11) == refuse  # i386's execve through int 0x80
    if machine == "x86_64":
        assert verdict(arch, 0x40000000 | 520) == refuse  # x32's execve


def test_every_course_notebook_is_graded_by_a_kernel_that_starts_no_program_but_14_on_a_gpu():
    from attention_ref.checks._core import REGISTRY

    by_notebook: dict[str, list[str]] = {}
    for name, ex in REGISTRY.items():
        by_notebook.setdefault(ex.run.__module__.rsplit(".nb", 1)[1], []).append(name)
    assert len(by_notebook) == 15
    for nb, exercises in by_notebook.items():
        assert trusted.forbids_new_programs(exercises), nb  # Triton's interpreter: none
        assert trusted.forbids_new_programs(exercises, gpu=True) == (nb != "14"), nb
    assert not trusted.forbids_new_programs([])  # an instructor's own assignment
    assert not trusted.kernel_sees_a_gpu(sandboxed=True)  # the sandbox's /dev has none
    # how the grader tells a sandboxed kernel (attention_ref/course/cell_limits.py)
    from attention_ref.trust import sandbox

    assert hasattr(sandbox.kernel_manager_class(), "checker_socket")
