"""Issue 17 item 4: the control file carries a resize (world size + each rank's new rank), checked both ways; the
agent parses a downgrade's extraParams once and offers a resize only when the job and every rank opted in."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from taskd.agent.link.orders import Command, Order
from taskd.agent.ranks.resize import Resize, offers
from taskd.worker.live import FLAG_DECLARED, FLAG_RESIZE, LiveProtocolError, _status, read_control, write_control
from taskd.worker.torch_resize import Resize as RankResize


def test_a_resize_round_trips_and_an_old_control_file_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    written = write_control(path, 7, "rejoin", timeout=30, world_size=4, ranks={4: 2, 5: 3})
    body = json.loads(path.read_text())
    assert body["world_size"] == 4 and body["ranks"] == {"4": 2, "5": 3}
    read = read_control(path)
    assert read == written and read.world_size == 4 and read.ranks == {4: 2, 5: 3} and read.extra == {}
    assert read.rank_of(5) == 3 and read.rank_of(0) is None
    path.write_text(json.dumps({"generation": 3, "action": "rejoin", "timeout": 10.0, "time": 1.0}))
    old = read_control(path)  # the format before resizes: no resize, ranks keep their own
    assert old.world_size is None and old.ranks == {} and old.rank_of(5) is None


@pytest.mark.parametrize(("body", "why"), [
    ({"world_size": 4}, "come together"),
    ({"ranks": {"0": 0}}, "come together"),
    ({"world_size": 0, "ranks": {}}, "world_size must be an integer >= 1"),
    ({"world_size": True, "ranks": {}}, "world_size must be an integer >= 1"),
    ({"world_size": 2, "ranks": [0, 1]}, "must map"),
    ({"world_size": 2, "ranks": {"x": 0}}, "is not a rank"),
    ({"world_size": 2, "ranks": {"3": 2}}, "not a rank in [0, 2)"),
    ({"world_size": 2, "ranks": {"3": 1, "4": 1}}, "twice"),
], ids=["size-only", "ranks-only", "zero", "bool", "list", "key", "range", "twice"])
def test_a_malformed_resize_is_refused_naming_what_is_wrong(tmp_path: Path, body: dict, why: str) -> None:
    path = tmp_path / "control.json"
    path.write_text(json.dumps({"generation": 2, "action": "rejoin", **body}))
    with pytest.raises(LiveProtocolError, match=why.replace("[", r"\[").replace(")", r"\)")):
        read_control(path)
    with pytest.raises(LiveProtocolError):
        write_control(path, 2, world_size=body.get("world_size"), ranks=body.get("ranks"))


def test_the_resize_flag_is_read_from_the_heartbeat_live_fields() -> None:
    live = (FLAG_DECLARED | FLAG_RESIZE, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0.0)
    status = _status(SimpleNamespace(), live, torn=False)  # type: ignore[arg-type]
    assert status.can_resize and status.declared and not status.can_rejoin
    assert not _status(SimpleNamespace(), (FLAG_DECLARED, *live[1:]), torn=False).can_resize  # type: ignore[arg-type]


def test_a_rank_takes_its_place_from_the_control_file_and_owes_its_hook_once(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    r = RankResize(lambda rank, world: calls.append((rank, world)), started_as=5, rank=5, world_size=6)
    write_control(tmp_path / "c", 4, world_size=4, ranks={4: 2, 5: 3})
    place = r.place(read_control(tmp_path / "c"), 5, 6)
    assert place == (3, 4) and r.owed(*place)
    r.run(*place)
    r.run(*place)  # once per change
    assert calls == [(3, 4)]
    assert r.place(None, 3, 4) == (3, 4)  # no resize: the rank keeps its place
    write_control(tmp_path / "c", 5, world_size=4, ranks={0: 0})
    with pytest.raises(LiveProtocolError, match="names no rank for the one started as rank 5"):
        r.place(read_control(tmp_path / "c"), 3, 4)
    hookless = RankResize(None, started_as=5, rank=5, world_size=6)
    assert not hookless.declared
    with pytest.raises(LiveProtocolError, match="no on_resize hook"):
        hookless.place(read_control(tmp_path / "c"), 5, 6)


def _order(params: dict) -> Order:
    sig = SimpleNamespace(fault_ranks={"4": "1"}, uuid="j-1-9", signal_type="changeStrategy",
                          actions=("changeStrategy",), strategy="downgrade", timeout=300,
                          extra_params=json.dumps(params))
    return Order.of(Command.CHANGE, sig)


def test_an_orders_new_world_size_and_rank_map_are_parsed_once_and_checked() -> None:
    order = _order({"generation": 9, "restarts": 1, "world_size": 4, "rank_map": {"0": 0, "1": 1, "4": 2, "5": 3}})
    assert order.generation == 9 and order.resize == Resize(4, {0: 0, 1: 1, 4: 2, 5: 3})
    assert order.resize.of_node([4, 5]) == {4: 2, 5: 3}
    assert _order({"generation": 9}).resize is None  # a recover
    for bad in ({"world_size": 4, "rank_map": {"0": 0}},  # names 1 of 4 new ranks
                {"world_size": 2, "rank_map": {"0": 0, "1": 0}}, {"world_size": "4", "rank_map": {}},
                {"world_size": 2, "rank_map": [0, 1]}, {"world_size": 2, "rank_map": {"a": 0, "1": 1}}):
        assert _order(bad).resize is None, bad


def test_a_node_offers_downgrade_and_upgrade_only_when_the_job_and_every_rank_opted_in() -> None:
    base = ["retry", "recover", "job-rescheduling", "exit"]
    assert offers(base, scales=True, live=True, every_rank_resizes=True) == [*base, "downgrade", "upgrade"]
    for scales, live, every in ((False, True, True), (True, False, True), (True, True, False)):
        assert offers(base, scales, live, every) == base
