"""A job as `ListJobs` shows it: its state in memory, its history (rounds, events, node losses) from the store."""

from __future__ import annotations

from taskd.controller.clock import Clock
from taskd.controller.machine.state_machine import JobMachine
from taskd.controller.nodes.replicas import snapshot_records
from taskd.controller.nodes.stragglers import straggler_records
from taskd.controller.service.hub import SignalHub
from taskd.controller.storage.store import Store
from taskd.proto import recover_pb2, taskd_pb2


def job_record(m: JobMachine, store: Store, hub: SignalHub, clocks: Clock) -> taskd_pb2.JobRecord:
    def wall(t: float) -> float:
        return clocks.to_wall(t) if t else 0.0

    agents = [
        taskd_pb2.AgentRecord(nodeRank=a.node_rank, role=a.role, host=a.host, pid=a.pid,
                              ranksPerNode=a.ranks_per_node, subscribed=hub.has(m.job_id, a.node_rank),
                              registeredAt=wall(a.registered_at), lastSeen=wall(a.last_seen), finished=a.finished,
                              exitCode=a.exit_code)
        for a in sorted(m.agents.values(), key=lambda a: a.node_rank)
    ] + [
        taskd_pb2.AgentRecord(role=s.role, host=s.host, pid=s.pid, standby=True,
                              subscribed=hub.has_standby(m.job_id, key), registeredAt=wall(s.since),
                              lastSeen=wall(s.since))
        for key, s in sorted(m.standbys.items(), key=lambda item: item[1].since)
    ]
    losses: dict[int, list[taskd_pb2.NodeLossRecord]] = {}
    for x in store.node_losses(m.job_id):
        losses.setdefault(x["round"], []).append(taskd_pb2.NodeLossRecord(
            nodeRank=x["node_rank"], oldHost=x["old_host"], oldPid=x["old_pid"], lostAt=x["lost_at"],
            newHost=x["new_host"], newPid=x["new_pid"], replacedAt=x["replaced_at"], standby=bool(x["standby"]),
            secondsToRoundEnd=x["seconds_to_round_end"], secondsToTrainingResumed=x["seconds_to_training_resumed"]))
    rounds = [
        taskd_pb2.RoundRecord(
            round=r["round"], startedAt=r["started_at"], endedAt=r["ended_at"],
            faultRanks=[recover_pb2.FaultRank(rankId=str(k), faultType=t) for k, t in r["faults"]],
            strategiesTried=r["tried"], strategy=r["strategy"], outcome=r["outcome"],
            durationSeconds=r["duration"], nodeLosses=losses.get(r["round"], []),
            secondsToTrainingResumed=r["training_resumed"],
        )
        for r in store.rounds(m.job_id)
    ]
    events = [taskd_pb2.EventRecord(time=e["time"], kind=e["kind"], round=e["round"], detail=e["detail"])
              for e in store.events(m.job_id)]
    return taskd_pb2.JobRecord(
        jobId=m.job_id, state=m.state.value, nodeCount=m.node_count, ranksPerNode=m.ranks_per_node,
        restarts=m.restarts, maxRestarts=m.max_restarts, createdAt=wall(m.created_at), updatedAt=wall(m.updated_at),
        agents=agents, rounds=rounds, events=events, info=m.info, rejoining=sorted(m.rejoining),
        stragglers=straggler_records(m, clocks.to_wall), absent=sorted(m.absent),
        worldSize=(m.node_count - len(m.absent)) * m.ranks_per_node,
        snapshots=snapshot_records(m, clocks.to_wall, clocks.now()),
    )
