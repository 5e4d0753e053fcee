"""Keep the agent's credentials out of its ranks' reach (issue 31, F4).

Ranks run as the agent's user, and Linux lets a process read another of its user's `/proc/<pid>/cmdline`
(always), `environ`, `mem` and `maps`, and ptrace it, unless that process is not *dumpable*. So once the
agent has read its credentials, and before any rank starts, it

- removes every credential path from the argument area the kernel shows as `/proc/<pid>/cmdline`
  (the flag and its value; later arguments move up, the end is padded with NULs): Python keeps its own
  copy (`sys.argv`), and nothing reads the original after start-up;
- blanks the credential variables' entries (TASKD_TOKEN_FILE, TASKD_TLS_*) in the environment area the
  kernel shows as `/proc/<pid>/environ` (overwritten in place with NULs, never moved: libc's `environ`
  points into it) and drops them from `os.environ`, so no child started with it inherits them;
- makes itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): `/proc/<pid>/environ`, `mem`, `maps`,
  `fd/*`, `cwd` and `exe`, ptrace and `process_vm_readv` are then refused to every process without
  CAP_SYS_PTRACE, the same user's included; the process's own memory holds the token.

Costs (RELIABILITY.md, "Ranks"): no core dump of the agent, `py-spy dump` of the agent only as root, and
psutil's `environ()`, `cwd()`, `open_files()`, `io_counters()` of the agent refused to other processes
of its user (and `/proc/self/environ` to the agent itself). Dumpability is reset by `execve`: ranks,
their tools and py-spy run on ranks are unaffected.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass

from taskd.process.prctl import prctl

log = logging.getLogger(__name__)

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def without_values(block: bytes, values: Iterable[str], flags: Iterable[str]) -> bytes:
    """A NUL-separated argument block without any argument equal to one of `values`, the flag before it
    (an argument that is an unambiguous prefix of one of `flags`, as argparse accepts), or `--flag=value`;
    padded with NULs to its length (what the kernel shows must stay inside the original area)."""
    secrets = {v.encode() for v in values if v}
    if not secrets:
        return block
    names = tuple(flags)
    args = block.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    kept: list[bytes] = []
    for arg in args:
        if arg in secrets:
            if kept and _is_flag(kept[-1], names):
                kept.pop()
            continue
        flag, eq, value = arg.partition(b"=")
        if eq and value in secrets and _is_flag(flag, names):
            continue
        kept.append(arg)
    out = b"".join(a + b"\0" for a in kept)
    return out + b"\0" * (len(block) - len(out))


def _is_flag(arg: bytes, flags: tuple[str, ...]) -> bool:
    return arg.startswith(b"--") and len(arg) > 2 and any(f.encode().startswith(arg) for f in flags)


def blanked(block: bytes, is_secret_name: Callable[[str], bool]) -> bytes:
    """A NUL-separated `NAME=value` block with each entry whose name `is_secret_name` overwritten by NULs in
    place: every other entry keeps its offset (libc's `environ` still points at them)."""
    out = bytearray(block)
    start = 0
    while start < len(block):
        end = block.find(b"\0", start)
        end = len(block) if end < 0 else end
        name, eq, _ = block[start:end].partition(b"=")
        if eq and is_secret_name(name.decode("utf-8", "replace")):
            out[start:end] = b"\0" * (end - start)
        start = end + 1
    return bytes(out)


@dataclass(frozen=True)
class Concealed:
    """What `conceal` did, for the agent's debug log and the tests."""

    argv_scrubbed: bool
    environ_scrubbed: bool
    dumpable: bool
    forgotten: tuple[str, ...]


def _areas() -> tuple[int, int, int, int] | None:
    """arg_start, arg_end, env_start, env_end of this process (proc(5), /proc/pid/stat fields 48-51)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2:].split()
        return int(fields[45]), int(fields[46]), int(fields[47]), int(fields[48])
    except (OSError, ValueError, IndexError):
        return None


def _rewrite(start: int, current: bytes, new: bytes) -> bool:
    """Write `new` over `current`, the bytes this process's memory holds at `start` (read just before)."""
    if len(new) != len(current) or not current:
        return False
    if new != current:
        ctypes.memmove(start, new, len(new))
    return True


def conceal(paths: Iterable[str | None], flags: Iterable[str], is_secret_name: Callable[[str], bool],
            environ: MutableMapping[str, str] | None = None) -> Concealed:
    """Hide this process's credentials from the other processes of its user (module docstring): `paths`
    are the credential files named on its command line after one of `flags`, `is_secret_name` tells the
    variables that name or hold one (taskd.worker.env.is_credential_var). Call it after reading them and
    before starting any child. Where Linux offers none of this (not Linux), it does what it can."""
    env = os.environ if environ is None else environ
    forgotten = tuple(sorted(name for name in env if is_secret_name(name)))
    for name in forgotten:
        del env[name]
    argv_done = environ_done = False
    areas = _areas()
    if areas is not None:
        arg_start, arg_end, env_start, env_end = areas
        try:
            with open("/proc/self/cmdline", "rb") as fh:
                shown = fh.read()
            args = ctypes.string_at(arg_start, arg_end - arg_start)
            # the kernel's view and the memory must agree, or these are not the areas we think they are
            if shown == args:
                argv_done = _rewrite(arg_start, args, without_values(args, [p for p in paths if p], flags))
            envs = ctypes.string_at(env_start, env_end - env_start)
            environ_done = _rewrite(env_start, envs, blanked(envs, is_secret_name))
        except (OSError, ValueError) as exc:
            log.debug("could not rewrite this process's argument or environment area: %s", exc)
    dumpable = True
    if prctl is not None and prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
        dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0
    result = Concealed(argv_done, environ_done, dumpable, forgotten)
    log.debug("credentials concealed from this user's other processes: %s", result)
    return result
