"""The sandbox's seccomp profile: the engine's default allowance minus process tampering (pure).

Why: the agent is root in its sandbox, Docker 20.10's default profile allows `ptrace`
(kernel >= 4.8) and this kernel has no Yama LSM, so an agent could attach to any process
in its sandbox, e.g. the keep-alive, and make it run code of its own later (issue 20).

What the profile is: `defaultAction` SCMP_ACT_ALLOW and an explicit deny list returning
EPERM (`DENIED`), written here rather than copied from the engine's 800-line allow list.
Denied:
- process tampering: ptrace, process_vm_readv/writev, pidfd_getfd (another process's file
  descriptors), process_madvise, kcmp;
- what Docker's default already refuses a container without CAP_SYS_ADMIN & co.: keyring
  (add_key, keyctl, request_key), bpf, perf_event_open, userfaultfd, mounts and the new
  mount API, unshare, setns, pivot_root, chroot, kernel modules and kexec, reboot, swap,
  clock setting, quotactl, open_by_handle_at, acct, syslog, iopl/ioperm, personality-free
  legacy calls (uselib, ustat, sysfs, _sysctl, vm86), fanotify_init, lookup_dcookie, vhangup,
  nfsservctl;
- io_uring_* (newer engines refuse them too: their requests bypass per-syscall filtering);
- `clone` with CLONE_NEWUSER (a user namespace would give the agent every capability in
  it), and `clone3` answered ENOSYS, as Docker does, so that libc falls back to `clone`,
  whose flags a filter can see.
What it does not cover compared with Docker's default: Docker's list is an allow list, so
a syscall added to a newer kernel is refused there and allowed here; Docker also limits
`personality` to a few values and gates clone's other namespace flags on CAP_SYS_ADMIN
(here only CLONE_NEWUSER is filtered: the other namespaces need CAP_SYS_ADMIN, which the
engine does not grant). Reading another process's memory through /proc/PID/mem is not a
syscall of its own: the verification restart (`Sandbox.restart_for_verification`) is what
makes a tampered process harmless, the profile only narrows what the agent can do to its
own sandbox meanwhile. A syscall name the host's libseccomp does not know is skipped by
runc, so one list serves every kernel.
"""

from __future__ import annotations

import json
from functools import cache

EPERM = 1
ENOSYS = 38
CLONE_NEWUSER = 0x10000000

PROCESS_TAMPERING = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
)
PRIVILEGED = (
    "acct",
    "add_key",
    "bpf",
    "chroot",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_settime",
    "clock_settime64",
    "create_module",
    "delete_module",
    "fanotify_init",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "syslog",
    "_sysctl",
    "sysfs",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vm86",
    "vm86old",
)
DENIED = PROCESS_TAMPERING + PRIVILEGED

# Docker's architecture map for the hosts it runs on: a rule names a syscall on every ABI
# the host can run (an x86_64 process can make i386 and x32 calls too).
ARCH_MAP = [
    {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
    {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
]


def profile() -> dict[str, object]:
    """The profile as the engine's JSON schema (module docstring)."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "archMap": ARCH_MAP,
        "syscalls": [
            {"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                # clone's flags are argument 0 on x86 and arm (s390 swaps them; not served).
                "args": [
                    {
                        "index": 0,
                        "value": CLONE_NEWUSER,
                        "valueTwo": CLONE_NEWUSER,
                        "op": "SCMP_CMP_MASKED_EQ",
                    }
                ],
            },
        ],
    }


@cache
def profile_json() -> str:
    """The profile as the text `security_opt=["seccomp=<text>"]` takes (compact, stable)."""
    return json.dumps(profile(), separators=(",", ":"), sort_keys=True)
