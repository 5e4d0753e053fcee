"""`taskd status`: fetch the controller's read-only job view and render it for people or scripts."""

from __future__ import annotations

import json
import time

import grpc
from google.protobuf import json_format

from taskd.address import controller_target
from taskd.proto import taskd_pb2, taskd_pb2_grpc
from taskd.vocabulary import DEFAULT_PORT

__all__ = ["fetch_jobs", "normalize_address", "render_json", "render_text"]


def normalize_address(address: str) -> str:
    """The controller address `taskd status --server` takes; ValueError saying what is wrong."""
    return controller_target(address, DEFAULT_PORT)


PAGE_SIZE = 200
MAX_PAGE_BYTES = 64 * 1024 * 1024  # one job's page may pass the 4 MB default (the server's send limit)
MAX_PAGES = 100_000


def fetch_jobs(address: str, job_id: str | None = None, timeout: float = 5.0, token: str | None = None,
               credentials: grpc.ChannelCredentials | None = None) -> taskd_pb2.JobList:
    """ListJobs on the controller at `address` (`host[:port]`, as MINDX_SERVER_IP), page by page, so that no
    job list is too big for one message; `timeout` is per page. Raises ValueError for an address that is not
    one, grpc.RpcError when the controller cannot be reached or refuses the call."""
    target = normalize_address(address)
    options = [("grpc.max_receive_message_length", MAX_PAGE_BYTES)]
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    channel = (grpc.secure_channel(target, credentials, options=options) if credentials is not None
               else grpc.insecure_channel(target, options=options))
    with channel:
        stub = taskd_pb2_grpc.JobStatusStub(channel)
        if job_id:
            return stub.ListJobs(taskd_pb2.JobQuery(jobId=job_id), timeout=timeout, metadata=metadata)
        out = taskd_pb2.JobList()
        token_ = ""
        for _ in range(MAX_PAGES):
            page = stub.ListJobs(taskd_pb2.JobQuery(pageSize=PAGE_SIZE, pageToken=token_), timeout=timeout,
                                 metadata=metadata)
            out.status.CopyFrom(page.status)
            out.jobs.extend(page.jobs)
            token_ = page.nextPageToken
            if page.status.code != 0 or not token_:
                break
        return out


def read_credentials(token_file: str | None, ca: str | None, cert: str | None, key: str | None
                     ) -> tuple[str | None, grpc.ChannelCredentials | None]:
    """(token, TLS channel credentials) from files; ValueError naming the file that cannot be used."""
    def read(path: str, what: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise ValueError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None

    token = read(token_file, "the token file").decode("ascii", "replace").strip() if token_file else None
    if token_file and not token:
        raise ValueError(f"the token file {token_file!r} is empty")
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key and the key its certificate (--tls-cert, --tls-key)")
    if ca is None and cert is None:
        return token, None
    return token, grpc.ssl_channel_credentials(
        root_certificates=read(ca, "the CA certificate") if ca else None,
        private_key=read(key, "the client key") if key else None,
        certificate_chain=read(cert, "the client certificate") if cert else None)


def _ts(t: float) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def _faults(faults) -> str:  # noqa: ANN001 - repeated FaultRank
    return ", ".join(f"rank {f.rankId} (type {f.faultType})" for f in faults) or "-"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip()]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return out


def render_text(job_list: taskd_pb2.JobList, events: int = 20) -> str:
    """A human summary: each job, its agents, every round (faults, strategies, outcome, duration), last events."""
    if job_list.status.code != 0:
        return f"error {job_list.status.code}: {job_list.status.info}\n"
    if not job_list.jobs:
        return "no jobs\n"
    out: list[str] = []
    for job in job_list.jobs:
        out.append(f"job {job.jobId}: {job.state}")
        out.append(f"  nodes {job.nodeCount}, ranks per node {job.ranksPerNode or '-'}, "
                   f"restarts {job.restarts}/{job.maxRestarts}, created {_ts(job.createdAt)}, "
                   f"updated {_ts(job.updatedAt)}")
        out += _size(job)
        if job.info:
            out.append(f"  {job.info}")
        out.append("  agents:")
        rows = []
        for a in job.agents:
            rpn = a.ranksPerNode or job.ranksPerNode
            ranks = f"{a.nodeRank * rpn}-{a.nodeRank * rpn + rpn - 1}" if rpn and not a.standby else "-"
            finished = f"exit {a.exitCode}" if a.finished else "-"
            rows.append(["standby" if a.standby else str(a.nodeRank), a.host or "-", str(a.pid or "-"), ranks,
                         "yes" if a.subscribed else "no", _ts(a.lastSeen), finished])
        out += ["    " + line for line in _table(["node", "host", "pid", "ranks", "subscribed", "last seen",
                                                    "finished"], rows)] if rows else ["    (none registered)"]
        spares = [f"{a.host}:{a.pid} waiting since {_ts(a.registeredAt)}" for a in job.agents if a.standby]
        if spares:
            out.append(f"  standbys: {', '.join(spares)}")
        # A rerun under the same job id resets the job (its budget, its agents) but keeps its history: the
        # rounds of earlier runs are not this run's, next to this run's "restarts 0/3".
        reset_at = max((e.time for e in job.events if e.kind == "job_reset"), default=None)
        earlier = [r for r in job.rounds if reset_at is not None and r.startedAt < reset_at]
        out.append("  faults and recoveries:" if reset_at is None else
                   f"  faults and recoveries of this run (since the job was reset at {_ts(reset_at)}):")
        rows = []
        for r in (r for r in job.rounds if reset_at is None or r.startedAt >= reset_at):
            duration = f"{r.durationSeconds:.3f}s" if r.endedAt else "-"
            resumed = f"{r.secondsToTrainingResumed:.3f}s" if r.secondsToTrainingResumed else "-"
            rows.append([str(r.round), _ts(r.startedAt), _faults(r.faultRanks), " -> ".join(r.strategiesTried) or "-",
                         r.outcome, r.strategy or "-", _ts(r.endedAt), duration, resumed])
        out += ["    " + line for line in _table(["round", "fault at", "faults", "strategies tried", "outcome",
                                                    "strategy", "ended at", "duration", "fault -> training resumed"],
                                                   rows)] if rows else ["    (none)"]
        if earlier:
            numbers = f"round {earlier[0].round}" if len(earlier) == 1 else \
                f"rounds {earlier[0].round}-{earlier[-1].round}"
            out.append(f"  earlier runs of this job id: {numbers}, the last at {_ts(earlier[-1].startedAt)} "
                       "(`taskd status --json` lists them)")
        out += _node_losses(job)
        out += _restores(job)
        out += _stragglers(job)
        out += _snapshots(job)
        if events and job.events:
            out.append(f"  last {min(events, len(job.events))} events:")
            for e in job.events[-events:]:
                out.append(f"    {_ts(e.time)}  round {e.round:<3} {e.kind:<20} {e.detail}")
        out.append("")
    return "\n".join(out)


def _unseen(job) -> dict[tuple[int, int], float]:  # noqa: ANN001 - JobRecord
    """{(node rank, pid): seconds its agent had been without a stream when declared lost}, from `node_lost`."""
    out = {}
    for e in job.events:
        if e.kind == "node_lost":
            try:
                d = json.loads(e.detail or "{}")
                out[(int(d["node_rank"]), int(d["pid"]))] = float(d["seconds"])
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _node_losses(job) -> list[str]:  # noqa: ANN001 - JobRecord
    """One line per node a round lost: its old and new host, how long from the loss to the round's end and to
    training resumed, with how long before being declared lost its agent's stream had ended (the grace, or the
    loss timeout)."""
    out = []
    unseen = _unseen(job)
    for r in job.rounds:
        for x in r.nodeLosses:
            new = (f"{x.newHost}:{x.newPid}" + (" (standby)" if x.standby else "") + f" at {_ts(x.replacedAt)}"
                   if x.replacedAt else "no replacement yet")
            before = unseen.get((x.nodeRank, x.oldPid))
            gone = (f"; its agent had been without a signal stream for {before:.3f}s when declared lost"
                    if before is not None else "")
            took = (f"; lost -> round ended {x.secondsToRoundEnd:.3f}s (from the node's fault, its agent's stream "
                    "ending or its last word, to the last agent's recover status)" if x.secondsToRoundEnd else "")
            took += (f"; lost -> training resumed {x.secondsToTrainingResumed:.3f}s (to the last node's ranks "
                     "training again, as its agent reported)" if x.secondsToTrainingResumed else "")
            took += gone
            out.append(f"    round {r.round}: node {x.nodeRank} lost (agent {x.oldHost}:{x.oldPid}) at "
                       f"{_ts(x.lostAt)}, replaced by {new}{took}")
    if job.rejoining:
        out.append(f"  waiting for a replacement of node(s) {', '.join(map(str, job.rejoining))}")
    return out


def _restores(job) -> list[str]:  # noqa: ANN001 - JobRecord
    """One line per round whose ranks restored from snapshots (issue 33): each node's source, the step restored
    and the steps redone, from the round's `round_training_resumed` event (its agents' reports)."""
    out = []
    for e in job.events:
        if e.kind != "round_training_resumed":
            continue
        try:
            restored = json.loads(e.detail or "{}").get("restored") or {}
            parts = [f"node {n} from {x['from']} at step {x['step']}" +
                     (f", {x['steps_redone']} step(s) redone" if x.get("steps_redone") is not None else "")
                     for n, x in sorted(restored.items(), key=lambda item: int(item[0]))]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if parts:
            out.append(f"    round {e.round}: restored {'; '.join(parts)}")
    return out


def _size(job) -> list[str]:  # noqa: ANN001 - JobRecord
    """The job's current size, and each resize (downgrade/upgrade: issue 17), when it ever changed size."""
    resized = [e for e in job.events if e.kind == "resized"]
    if not resized and not job.absent:
        return []
    present = job.nodeCount - len(job.absent)
    out = [f"  size: {present} of {job.nodeCount} node(s), world size {job.worldSize}"
           + (f", without node(s) {', '.join(map(str, job.absent))}" if job.absent else "")]
    for e in resized:
        try:
            d = json.loads(e.detail or "{}")
        except ValueError:
            d = {}
        out.append(f"    {_ts(e.time)}  round {e.round}: {d.get('strategy', '?')} to {d.get('node_count', '?')} "
                   f"node(s), world size {d.get('world_size', '?')}")
    return out


def _stragglers(job) -> list[str]:  # noqa: ANN001 - JobRecord
    """The ranks judged stragglers now: each with its node, host and how much longer it computes per step."""
    if not job.stragglers:
        return []
    out = ["  stragglers (compute seconds per step outside collectives, against the median of the other ranks):"]
    for s in job.stragglers:
        out.append(f"    rank {s.rank} (node {s.nodeRank}, {s.host or '?'}): {s.ratio:.2f}x, "
                   f"{s.computeSeconds:.3f}s vs {s.medianSeconds:.3f}s, since {_ts(s.since)}")
    return out


def _snapshots(job) -> list[str]:  # noqa: ANN001 - JobRecord
    """Each node's snapshot replication to its buddy (issue 33): how far the buddy's copy is behind."""
    if not job.snapshots:
        return []
    out = ["  snapshots (each node's newest step, and its buddy's copy):"]
    for s in job.snapshots:
        buddy = f"node {s.buddyNodeRank}" if s.buddyNodeRank >= 0 else "no buddy"
        behind = s.newestStep > s.replicatedStep  # the lag then counts from the first step the copy lacks
        held = (f"step {s.replicatedStep}" if s.replicatedStep >= 0 else "none") + (
            f" ({s.lagSeconds:.3f}s behind)" if behind and s.lagSeconds > 0 else
            f" (copied {s.lagSeconds:.3f}s after its publish)" if s.replicatedStep >= 0 else "")
        out.append(f"    node {s.nodeRank}: newest step {s.newestStep}; {buddy} holds {held} "
                   f"(reported {_ts(s.reportedAt)})")
    return out


def render_json(job_list: taskd_pb2.JobList) -> str:
    """The JobList as JSON (proto field names), with each event's detail parsed into an object."""
    data = json_format.MessageToDict(job_list, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    for job in data.get("jobs", []):
        for e in job.get("events", []):
            try:
                e["detail"] = json.loads(e.get("detail") or "{}")
            except ValueError:
                pass
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
