"""No new program from a graded kernel: ``execve`` refused, for every thread, for good.

PyTorch's fused attention is removed from a graded kernel (:mod:`.fused_removal`), and the
grading edition holds no answer of the notebook graded (:mod:`attention_ref._withheld`). A
new process started from the kernel would have neither loss: ``python -c`` with PyTorch
whole, or a program that reads what the kernel cannot. So before the learner's first cell,
a kernel that grades such a notebook runs :func:`forbid_new_programs`, which installs a
seccomp filter on every thread of the process (``SECCOMP_FILTER_FLAG_TSYNC``; threads
started later inherit it): ``execve`` and ``execveat`` fail with ``EPERM``, and so does
every system call made through another ABI (i386's ``int 0x80``, x32), which could name
``execve`` by another number. A seccomp filter cannot be removed or loosened by the
process that has it, nor by its children; ``fork`` stays allowed, and a forked child is
the same kernel, with the same losses.

What it costs a learner: a shell command (``!ls``) or a ``subprocess`` in a graded kernel
fails with ``PermissionError``; nothing a notebook of the course needs. Notebook 14 is left
out only where its kernel sees a GPU (Triton compiles its kernels there with ``ptxas``, a
program): never in the sandbox, whose ``/dev`` has none (``trusted.kernel_sees_a_gpu``).
"""

from __future__ import annotations

import ctypes
import errno
import platform

#: The audit architecture and the system-call numbers of each machine it knows:
#: (AUDIT_ARCH_*, execve, execveat, seccomp).
SYSCALLS = {
    "x86_64": (0xC000003E, 59, 322, 317),
    "aarch64": (0xC00000B7, 221, 281, 277),
}
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers

# Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: load a word of struct seccomp_data
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_NR, _ARCH = 0, 4  # offsets of the call's number and architecture in seccomp_data
_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_REFUSE = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO | EPERM
_SET_MODE_FILTER, _FLAG_TSYNC = 1, 1
_PR_SET_NO_NEW_PRIVS = 38


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter's instructions ``(code, jt, jf, k)`` for ``machine`` (this one's by
    default): another ABI's call refused, ``execve`` and ``execveat`` refused, the rest
    allowed."""
    arch, execve, execveat, _ = SYSCALLS[machine or platform.machine()]
    out = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch),  # this machine's ABI: go on; another: refused
        (_RET_K, 0, 0, _REFUSE),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if arch == SYSCALLS["x86_64"][0]:
        out += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, _REFUSE)]
    out += [
        (_JEQ_K, 2, 0, execve),
        (_JEQ_K, 1, 0, execveat),
        (_RET_K, 0, 0, _ALLOW),
        (_RET_K, 0, 0, _REFUSE),
    ]
    return out


def forbid_new_programs() -> bool:
    """Install the filter on every thread of this process; whether it is in place (False on
    a machine or kernel without seccomp, where nothing changes)."""
    machine = platform.machine()
    if machine not in SYSCALLS:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # needed without privileges
        return False
    instructions = program(machine)
    filters = (_Filter * len(instructions))(*[_Filter(*i) for i in instructions])
    prog = _Program(len(instructions), filters)
    nr_seccomp = SYSCALLS[machine][3]
    done = libc.syscall(nr_seccomp, _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog))
    return done == 0
