"""The failure report of `taskd run` comes from the failing incarnation, with torch's `@record` error first.

A real torch script decorated with `torch.distributed.elastic.multiprocessing.errors.record` fails on
rank 1 in every incarnation, with an exception and output that name the incarnation. With one restart
allowed, rank 1 fails twice and the job fails. The console must then open the failure with the root
cause rank 1 recorded in its *first* failing incarnation (exception, traceback, time: issue 12 item 2),
and the log lines shown under "first failure" must be that incarnation's, not the restarted one's
(issue 11 L6).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import leftovers
from support.run import taskd_run

pytest.importorskip("torch")

SCRIPT = '''
import os, sys, time
from pathlib import Path
from torch.distributed.elastic.multiprocessing.errors import record

def fail(incarnation):
    raise ValueError(f"rank 1 gives up in incarnation {incarnation}")

@record
def main():
    rank = int(os.environ["RANK"])
    runs = Path(sys.argv[1])
    runs.mkdir(exist_ok=True)
    incarnation = len(list(runs.glob(f"rank{rank}-*")))
    (runs / f"rank{rank}-{os.getpid()}").touch()
    print(f"rank {rank} incarnation {incarnation} says hello", flush=True)
    if rank == 1:
        from taskd import worker
        worker.heartbeat(1)  # past its start: an error before any step would not be retried (docs/pytorch.md)
        time.sleep(0.5)
        fail(incarnation)
    time.sleep(60)

if __name__ == "__main__":
    main()
'''


@pytest.mark.timeout(180)
def test_root_cause_from_record_is_shown_first_and_comes_from_the_failing_incarnation(tmp_path: Path) -> None:
    script = tmp_path / "record_fails.py"
    script.write_text(SCRIPT)
    console = tmp_path / "console.log"
    proc = taskd_run(["--nproc-per-node", "2", "--max-restarts", "1", str(script), str(tmp_path / "runs")], console)
    try:
        rc = proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = console.read_text(errors="replace")
    assert rc == 1, f"taskd run exited {rc}, expected rank 1's exit code 1\n{text}"
    assert len(list((tmp_path / "runs").glob("rank1-*"))) == 2, f"rank 1 should have run twice\n{text}"

    lines = text.splitlines()
    root = [i for i, ln in enumerate(lines) if "root cause (first observed failure): rank 1" in ln]
    failed = [i for i, ln in enumerate(lines) if "job FAILED" in ln]
    assert root and failed, f"no root cause or no failure summary on the console\n{text}"
    assert root[0] < failed[0], f"the root cause must come first\n{text}"
    head = lines[root[0]]
    assert "ValueError: rank 1 gives up in incarnation 0" in head, head  # the first failure's, not the second's
    assert re.search(r"rank 1 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: ", head), f"no time in {head!r}"
    report = "\n".join(lines[root[0]:failed[0]])
    assert "Traceback" in report and "in fail" in report, f"no traceback in the root cause\n{report}"

    tail = text.split("last lines of rank 1's log:")[-1]
    assert "rank 1 incarnation 0 says hello" in tail, f"not the failing incarnation's lines\n{tail}"
    assert "incarnation 1" not in tail, f"lines of a later incarnation in the first failure's printout\n{tail}"
    assert leftovers(str(script)) == []
