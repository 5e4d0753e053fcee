"""MindSpore's real msrun hands a job to taskd's MSRunPlugin (issue 4).

Each test runs the real `msrun` of the installed MindSpore with `MS_ENABLE_TFT='{RSC:1}'`, kills a
rank with SIGKILL (or lets one crash), and checks the outcome from outside: msrun's exit code, the
ranks' own records, the weights a real training wrote, and that nothing of the job is left running
and its `--master_port` is free. No `MINDX_SERVER_IP`: the plugin runs its embedded controller.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from support import kill_until_gone

from taskd.launcher.spec import free_port
from taskd.process.exitcodes import DUMPED_EXIT

if importlib.util.find_spec("mindspore") is None:
    pytest.skip("MindSpore is not installed (pip install -e '.[mindspore]'): msrun tests need it",
                allow_module_level=True)

BIN_DIR = Path(sys.executable).parent
MSRUN = shutil.which("msrun", path=str(BIN_DIR)) or shutil.which("msrun")
if MSRUN is None:
    pytest.skip("MindSpore is installed but its `msrun` command is not on PATH", allow_module_level=True)

pytestmark = pytest.mark.mindspore

REPO = Path(__file__).resolve().parents[3]
DUMMY = REPO / "tests" / "mindspore_scripts" / "dummy_train.py"
DUMMY_HANG = REPO / "tests" / "mindspore_scripts" / "dummy_hang.py"
SLOW_EXIT = REPO / "tests" / "mindspore_scripts" / "slow_exit.py"
TRAIN_DP = REPO / "examples" / "mindspore" / "train_dp.py"
FALLBACK_MARK = "process controlled by msrun"  # msrun's warning when it could not hand control over


def port_is_free(port: int) -> bool:
    """True when a new scheduler could listen on the port (SO_REUSEADDR ignores TIME_WAIT leftovers)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def processes_with(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions the marker (zombies have an empty one)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and marker in " ".join(proc.info["cmdline"] or ()):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_for(what: str, predicate: Callable[[], object], timeout: float, job: MsrunJob | None = None) -> object:
    """Poll until predicate() is truthy; fail with the job's logs when it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job is not None and job.proc.poll() is not None:
            pytest.fail(f"msrun exited ({job.proc.returncode}) while waiting for {what}\n{job.logs()}")
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{job.logs() if job else ''}")


class MsrunJob:
    """One `msrun` run with 2 local ranks; `marker` is a path unique to the test in every rank's argv."""

    def __init__(self, tmp_path: Path, name: str, script: Path, script_args: list[str], env: dict[str, str],
                 port: int | None = None):
        self.dir = tmp_path / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.marker = str(self.dir)
        self.log_dir = self.dir / "logs"
        self.port = port or free_port()
        self.console = self.dir / "msrun.out"
        cmd = [MSRUN, "--worker_num", "2", "--local_worker_num", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(self.port), "--log_dir", str(self.log_dir), "--join", "False",
               str(script), *script_args]
        with open(self.console, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                                         start_new_session=True)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"msrun still running after {timeout:.0f}s\n{self.logs()}")

    def output(self) -> str:
        return self.console.read_text(errors="replace")

    def logs(self, tail: int = 40) -> str:
        parts = [f"--- msrun console ({self.console})", *self.output().splitlines()[-tail:]]
        for path in sorted(self.log_dir.glob("*")) if self.log_dir.is_dir() else ():
            if path.is_file():
                lines = [ln for ln in path.read_text(errors="replace").splitlines() if "[INFO]" not in ln]
                parts += [f"--- {path.name}", *lines[-tail:]]
        return "\n".join(parts)

    def spawns(self, rank: int) -> int:
        """How often msrun spawned a rank: it prints one line per spawn on its console."""
        return self.output().count(f"Start worker process with rank id:{rank},")

    def assert_one_job_rescheduling(self) -> None:
        """One fault, one whole-job restart: msrun spawned every rank exactly twice."""
        counts = {rank: self.spawns(rank) for rank in (0, 1)}
        assert counts == {0: 2, 1: 2}, f"spawns per rank {counts}, expected 2 each\n{self.logs()}"

    def rank_process(self, rank: int) -> psutil.Process | None:
        """The live worker process of a global rank, found by marker and msrun's environment."""
        for proc in processes_with(self.marker):
            try:
                env = proc.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("MS_ROLE") == "MS_WORKER" and env.get("RANK_ID") == str(rank):
                return proc
        return None

    def scheduler_process(self) -> psutil.Process | None:
        """msrun's scheduler (or the one the plugin started in its place), found by marker and MS_ROLE."""
        for proc in processes_with(self.marker):
            try:
                if proc.environ().get("MS_ROLE") == "MS_SCHED":
                    return proc
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return None

    def kill(self) -> None:
        """Teardown, also after a failed assertion: end msrun first (so it spawns nothing more), then
        every process of the job (ranks are in sessions of their own), until none is left."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # msrun and its scheduler
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        kill_until_gone(lambda: processes_with(self.marker))

    def assert_plugin_in_control(self) -> None:
        out = self.output()
        assert FALLBACK_MARK not in out, f"msrun did not hand control to taskd\n{self.logs()}"

    def assert_nothing_left(self) -> None:
        """After msrun exited: no process of the job, and a new job could use the port."""
        def clean() -> bool:
            return not processes_with(self.marker) and port_is_free(self.port)

        deadline = time.monotonic() + 5  # reaping is synchronous; this only absorbs kernel lag
        while not clean() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [f"{p.pid}: {' '.join(p.cmdline())}" for p in processes_with(self.marker)]
        assert not left, "processes of the job are still running:\n" + "\n".join(left) + "\n" + self.logs()
        assert port_is_free(self.port), f"--master_port {self.port} is still in use\n{self.logs()}"


def make_env() -> dict[str, str]:
    """msrun's environment: plugin switched on, embedded controller, ranks run this interpreter."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MS_", "MINDX_", "TASKD_", "RANK_", "DEVICE_ID", "PYTEST_"))}
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"  # msrun starts ranks as `python <script>`
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["MS_ENABLE_TFT"] = "{RSC:1}"
    env["MINDX_TASK_ID"] = f"msrun-test-{uuid.uuid4().hex[:8]}"
    env["GLOG_v"] = "2"  # MindSpore: warnings and up
    env["TASKD_MAX_RESTARTS"] = "3"
    return env


@pytest.fixture
def msrun_env() -> dict[str, str]:
    return make_env()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., MsrunJob]]:
    """Start msrun jobs in tmp_path/<name>; `{dir}` in a script argument becomes that directory."""
    started: list[MsrunJob] = []

    def start(name: str, script: Path, script_args: list[str], env: dict[str, str],
              port: int | None = None) -> MsrunJob:
        args = [a.replace("{dir}", str(tmp_path / name)) for a in script_args]
        job = MsrunJob(tmp_path, name, script, args, env, port)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()


def files(directory: Path, prefix: str) -> list[Path]:
    return sorted(directory.glob(prefix + "*")) if directory.is_dir() else []


def started(state: Path, rank: int) -> list[Path]:
    return files(state, f"start-rank{rank}-")


def pid_of(record: Path) -> int:
    return int(record.name.rsplit("-", 1)[1])


class KilledDummyRun:
    """A dummy job whose rank 1 was SIGKILLed mid-run, shared by the tests that look at it."""

    def __init__(self, base: Path) -> None:
        self.env = make_env()
        self.job = MsrunJob(base, "dummy", DUMMY, ["--state-dir", str(base / "dummy" / "state"), "--duration", "5"],
                            self.env)
        self.state = self.job.dir / "state"
        try:
            wait_for("both ranks to start", lambda: started(self.state, 0) and started(self.state, 1), 90, self.job)
            time.sleep(0.5)  # mid-run
            self.victim = pid_of(started(self.state, 1)[0])
            os.kill(self.victim, signal.SIGKILL)
            self.rc = self.job.wait(120)
        except BaseException:
            self.job.kill()
            raise


@pytest.fixture(scope="module")
def killed_dummy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilledDummyRun]:
    run = None
    try:
        run = KilledDummyRun(tmp_path_factory.mktemp("killed-dummy"))
        yield run
    finally:
        if run is not None:
            run.job.kill()


@pytest.mark.timeout(180)
def test_dummy_rank_sigkilled_mid_run_is_recovered(killed_dummy):
    job, state, victim = killed_dummy.job, killed_dummy.state, killed_dummy.victim
    job.assert_plugin_in_control()
    assert killed_dummy.rc == 0, f"msrun exited {killed_dummy.rc} after a recoverable fault\n{job.logs()}"
    job.assert_one_job_rescheduling()
    out = job.output()  # the code is read whoever reaped the rank (the agent's peek or msrun's MONITOR poll)
    assert f"(pid {victim}) killed by SIGKILL" in out and "status unknown" not in out, job.logs()
    for rank in (0, 1):  # every spawn reached the script (a child can die between fork and exec)
        assert len(started(state, rank)) == 2, f"rank {rank}: 2 spawns but {len(started(state, rank))} runs"
        done = [pid_of(p) for p in files(state, f"done-rank{rank}-")]
        assert done, f"rank {rank} never finished a run\n{job.logs()}"
        assert victim not in done
    job.assert_nothing_left()


@pytest.mark.timeout(180)
def test_restarted_rank_keeps_its_old_log_and_taskd_logs_to_log_dir(killed_dummy):
    """msrun truncates a rank's log at each spawn: the plugin keeps the killed incarnation's log,
    and writes its own events to a file in msrun's --log_dir as well as to the console."""
    job, victim = killed_dummy.job, killed_dummy.victim
    logs = [p for p in job.log_dir.rglob("*") if p.is_file()]
    names = sorted(str(p.relative_to(job.log_dir)) for p in logs)
    kept = [p for p in logs if "worker_1" in p.name and p.name != "worker_1.log"
            and f"pid {victim} started" in p.read_text(errors="replace")]
    assert kept, f"the killed rank's log was not kept: {names}"
    own = [p for p in logs if p.name != "scheduler.log" and not p.name.startswith("worker_")
           and killed_dummy.env["MINDX_TASK_ID"] in p.read_text(errors="replace")]
    assert own, f"no taskd log file (mentioning the job id) in msrun's --log_dir: {names}"


AGENT_API_FALLBACK = "Import task agent"  # msrun's warning when `taskd.api.taskd_agent_api` did not import
AGENT_API_TAKEN = "start by taskd agent"  # msrun's line when it runs the job through start_taskd_agent()
PLUGIN_TAKEN = "start by mindx"  # ... and when it runs it through MSRunPlugin.start()


@pytest.mark.timeout(180)
def test_msrun_takes_the_taskd_agent_api_path(killed_dummy):
    """Issue 18 item 1: MindSpore 2.10 tries `taskd.api.taskd_agent_api` first; it must import, so no
    fallback line, and the job (rank 1 SIGKILLed, recovered above) ran through start_taskd_agent()."""
    out = killed_dummy.job.output()
    assert AGENT_API_FALLBACK not in out, f"msrun fell back from taskd.api\n{killed_dummy.job.logs()}"
    assert AGENT_API_TAKEN in out and PLUGIN_TAKEN not in out, killed_dummy.job.logs()


BLOCK_AGENT_API = """\
import importlib.abc, sys
class _NoAgentApi(importlib.abc.MetaPathFinder):  # an older taskd: no taskd.api package
    def find_spec(self, name, path=None, target=None):
        if name == "taskd.api" or name.startswith("taskd.api."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoAgentApi())
"""


@pytest.mark.timeout(180)
def test_without_taskd_api_msrun_plugin_still_recovers(jobs, msrun_env, tmp_path):
    """Older MindSpore imports only MSRunPlugin; with `taskd.api` hidden (a sitecustomize), msrun 2.10
    takes that path too: rank 1 SIGKILLed mid-run, one job-rescheduling, msrun exits 0."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_AGENT_API)
    msrun_env["PYTHONPATH"] = os.pathsep.join((str(site), msrun_env["PYTHONPATH"]))
    job = jobs("plugin-path", DUMMY, ["--state-dir", "{dir}/state", "--duration", "5"], msrun_env)
    state = job.dir / "state"
    wait_for("both ranks to start", lambda: started(state, 0) and started(state, 1), 90, job)
    time.sleep(0.5)
    os.kill(pid_of(started(state, 1)[0]), signal.SIGKILL)
    rc = job.wait(120)
    job.assert_plugin_in_control()
    out = job.output()
    assert "Import task agent: No module named 'taskd.api'" in out, job.logs()
    assert PLUGIN_TAKEN in out and AGENT_API_TAKEN not in out, job.logs()
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    job.assert_one_job_rescheduling()
    job.assert_nothing_left()


@pytest.mark.timeout(420)
def test_real_training_rank_sigkilled_is_rescheduled_and_a_rerun_on_its_port_matches_it(jobs, msrun_env):
    """Rank 1 of examples/mindspore/train_dp.py is SIGKILLed past its first checkpoint: one
    job-rescheduling, both ranks resume from a checkpoint, msrun exits 0. Then a fault-free rerun on the
    same --master_port at once (the old scheduler's connections sit in TIME_WAIT there for about 60 s;
    MindSpore's scheduler binds with SO_REUSEADDR) works, and its final weights are the faulty run's."""
    train = ["--steps", "16", "--ckpt-every", "4", "--ckpt-dir", "{dir}/ckpt", "--out", "{dir}/out"]
    job = jobs("faulty", TRAIN_DP, [*train, "--step-sleep", "0.1"], msrun_env)
    first_ckpt = job.dir / "ckpt" / "rank_1" / "step4.ckpt"
    victim = wait_for("rank 1 past its first checkpoint",
                      lambda: first_ckpt.exists() and job.rank_process(1), 150, job)
    victim.kill()

    rc = job.wait(240)
    job.assert_plugin_in_control()
    assert rc == 0, f"msrun exited {rc} after rank 1 was killed\n{job.logs()}"
    assert "job-rescheduling" in job.output(), f"no job-rescheduling in msrun's output\n{job.logs()}"
    job.assert_one_job_rescheduling()
    for rank in (0, 1):  # every rank restarted (job-rescheduling) and resumed from a checkpoint
        log = (job.log_dir / f"worker_{rank}.log").read_text(errors="replace")
        assert "resumed from step" in log, f"rank {rank} did not resume from a checkpoint\n{job.logs()}"
    job.assert_nothing_left()
    lingering = time_wait_on(job.port)
    assert lingering, f"no connection of --master_port {job.port} in TIME_WAIT: the rerun proves nothing"

    msrun_env["MINDX_TASK_ID"] = f"msrun-test-{uuid.uuid4().hex[:8]}"
    reference = jobs("reference", TRAIN_DP, train, msrun_env, port=job.port)
    rc = reference.wait(180)
    reference.assert_plugin_in_control()
    assert rc == 0, (f"a rerun on --master_port {job.port} ({lingering} connection(s) in TIME_WAIT when it "
                     f"started) failed ({rc})\n{reference.logs()}")
    expected = np.load(reference.dir / "out" / "rank_0.npy")
    assert np.array_equal(expected, np.load(reference.dir / "out" / "rank_1.npy"))
    for rank in (0, 1):
        weights = np.load(job.dir / "out" / f"rank_{rank}.npy")
        assert np.array_equal(weights, expected), f"rank {rank}'s final weights differ from the fault-free run"
    reference.assert_nothing_left()


def load_checkpoints(*paths: Path) -> list[dict[str, list[float]]]:
    """`mindspore.load_checkpoint` of each file, in a subprocess (this process never imports MindSpore)."""
    code = ("import json, sys, mindspore as ms\n"
            "print(json.dumps([{k: v.asnumpy().ravel().tolist() for k, v in ms.load_checkpoint(p).items()}"
            " for p in sys.argv[1:]]))")
    out = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GLOG_v": "3"})
    assert out.returncode == 0, f"load_checkpoint failed:\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
def test_dump_saves_loadable_checkpoints_from_dp_survivors(jobs, msrun_env):
    """Issue 18 item 4: train_dp.py on 2 ranks (one AllReduce per step), TASKD_STRATEGIES=dump,exit; rank 1
    SIGKILLed after step 4 (a checkpoint every 3 steps). The survivor sits in an AllReduce that never
    completes and cannot save from another thread (MindSpore), so it saves on its training thread once that
    AllReduce fails (MindSpore's default CPU collective timeout, 30 s, + ~3 s later), from `save_on_error()`.
    Issue 37: with no other setting, the dump's default wait covers that, the dump reports rank 0 saved,
    msrun exits DUMPED_EXIT (3, whoever reaped the killed rank), and rank 0's new checkpoint loads with the
    names of its regular one and the last step it completed."""
    msrun_env.update(TASKD_STRATEGIES="dump,exit")
    job = jobs("dump", TRAIN_DP, ["--steps", "400", "--ckpt-every", "3", "--ckpt-dir", "{dir}/ckpt",
                                  "--out", "{dir}/out", "--step-sleep", "0.1"], msrun_env)
    rank0, rank1 = job.dir / "ckpt" / "rank_0", job.dir / "ckpt" / "rank_1"
    log1 = job.log_dir / "worker_1.log"
    victim = wait_for("rank 1 past step 4 (its step-3 checkpoint written)",
                      lambda: (rank1 / "step3.ckpt").exists() and "rank 1 step 4 loss" in log1.read_text(
                          errors="replace") and job.rank_process(1), 120, job)
    killed_at = time.time()
    victim.kill()
    rc = job.wait(90)
    job.assert_plugin_in_control()
    out = job.output()
    assert rc == DUMPED_EXIT, f"a complete dump ends the job with {DUMPED_EXIT}, msrun exited {rc}\n{job.logs()}"
    assert "dump: saved: [0]; not saved: []" in out, f"rank 0 did not save for the dump\n{job.logs()}"
    assert out.count("dump under MindSpore: a rank whose peer died saves only once its collective fails") == 1
    log0 = (job.log_dir / "worker_0.log").read_text(errors="replace")
    # said before it saves: the exit that follows the dump may stop rank 0 before its traceback is printed
    assert "a step raised RuntimeError: Launch kernel failed: Default/AllReduce" in log0, \
        f"rank 0's AllReduce did not fail\n{job.logs()}"
    done = max(int(n) for n in re.findall(r"^rank 0 step (\d+) loss", log0, re.M))
    dump_file = rank0 / f"step{done}.ckpt"  # rank 0's AllReduce fails >= 30 s after the kill: then the dump writes it
    assert dump_file.exists() and dump_file.stat().st_mtime > killed_at + 25, f"no dump checkpoint\n{job.logs()}"
    regular, dumped = load_checkpoints(rank0 / "step3.ckpt", dump_file)
    assert sorted(dumped) == sorted(regular), f"{sorted(dumped)} vs {sorted(regular)}"
    assert dumped["step"] == [done] and done >= 4, (dumped["step"], done)
    assert any(dumped[k] != regular[k] for k in regular if k != "step")  # trained on after step 3
    assert not (rank1 / f"step{done}.ckpt").exists()
    job.assert_nothing_left()


@pytest.mark.timeout(180)
def test_rank_that_always_crashes_fails_the_job_once_restarts_are_spent(jobs, msrun_env):
    msrun_env["TASKD_MAX_RESTARTS"] = "1"
    args = ["--state-dir", "{dir}/state", "--duration", "60", "--crash", "always", "--crash-after", "0.3",
            "--scheduler-holds-port", "120"]
    job = jobs("crashing", DUMMY, args, msrun_env)
    state = job.dir / "state"
    wait_for("the scheduler to listen", lambda: files(state, "scheduler-"), 60, job)

    rc = job.wait(150)
    job.assert_plugin_in_control()
    assert rc != 0, f"msrun exited 0 although rank 1 never ran through\n{job.logs()}"
    assert job.spawns(1) == 2, f"expected 1 start + 1 restart of rank 1, got {job.spawns(1)}\n{job.logs()}"
    assert len(started(state, 1)) == 2, f"rank 1: 2 spawns but {len(started(state, 1))} runs\n{job.logs()}"
    assert not files(state, "done-"), "a rank finished although it should have been stopped"
    job.assert_nothing_left()


@pytest.mark.timeout(240)
def test_hung_rank_is_detected_named_dumped_and_job_rescheduled(jobs, msrun_env, tmp_path):
    """Issue 6 under msrun: rank 1 stops calling taskd.worker.heartbeat(); after TASKD_HEARTBEAT_TIMEOUT
    the plugin names the hang, gets the rank's Python stack into its log (faulthandler on the stack
    signal: msrun ranks have no log path the plugin could give py-spy) and restarts the whole job."""
    msrun_env["TASKD_HEARTBEAT_TIMEOUT"] = "2"
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0.2"
    tmp = tmp_path / "hang-tmp"  # where the plugin makes its heartbeat directory (and must remove it)
    tmp.mkdir()
    msrun_env["TMPDIR"] = str(tmp)
    job = jobs("hang", DUMMY_HANG, ["--state-dir", "{dir}/state", "--steps", "20", "--hang-at-step", "5"],
               msrun_env)
    state = job.dir / "state"

    rc = job.wait(150)
    job.assert_plugin_in_control()
    assert rc == 0, f"msrun exited {rc} after a recoverable hang\n{job.logs()}"
    agent_log = job.log_dir / "taskd_agent.log"
    for where, text in (("msrun's console", job.output()),
                        (agent_log.name, agent_log.read_text(errors="replace") if agent_log.exists() else "")):
        assert "hang: rank 1 (pid " in text, f"no 'hang: rank 1' in {where}\n{job.logs()}"
        assert "hang: rank 0" not in text, f"rank 0 kept beating but was called hung in {where}\n{job.logs()}"
    assert "job-rescheduling" in job.output(), f"no job-rescheduling in msrun's output\n{job.logs()}"
    job.assert_one_job_rescheduling()

    hung_pid = int((state / "hung").read_text())
    assert hung_pid in {pid_of(p) for p in started(state, 1)}, "the marker was not written by rank 1"
    hung_logs = [p for p in job.log_dir.glob("worker_1.log*")
                 if f"pid {hung_pid} started" in p.read_text(errors="replace")]
    assert len(hung_logs) == 1, f"the hung incarnation's log was not kept\n{job.logs()}"
    dump = hung_logs[0].read_text(errors="replace")
    assert "most recent call first" in dump and "in hang_forever" in dump, (
        f"no Python stack of the hung rank in {hung_logs[0].name}:\n{dump[-3000:]}")

    for rank in (0, 1):  # the restarted incarnation ran through
        assert files(state, f"done-rank{rank}-"), f"rank {rank} never finished after the restart\n{job.logs()}"
    assert hung_pid not in {pid_of(p) for p in files(state, "done-rank1-")}
    job.assert_nothing_left()
    assert not list(tmp.glob("taskd-heartbeat-*")), "the plugin made its heartbeat directory in $TMPDIR"
    assert not list(job.log_dir.glob("taskd-heartbeat-*")), "the plugin left its heartbeat directory behind"


MS_STALL = REPO / "tests" / "mindspore_scripts" / "ms_stall.py"


@pytest.mark.timeout(300)
def test_hung_rank_of_two_in_lockstep_is_the_one_that_stopped(jobs, msrun_env):
    """Issue 18 item 3: 2 real MindSpore ranks on one node, one AllReduce per step; rank 1 beats step 20
    0.05 s AFTER rank 0 (so rank 0's heartbeat is the older one, the old rule's pick), then is SIGSTOPped;
    in the rescheduled job it does the same but sleeps. Rank 0 waits in the next AllReduce each time. taskd
    must name rank 1 both times (by its process state, then by the stacks: rank 0's stop in MindSpore's
    asnumpy, rank 1's in the script), fault only rank 1, and the second job-rescheduling must finish the
    job. One launch for both ways of hanging."""
    msrun_env["TASKD_HEARTBEAT_TIMEOUT"] = "4"
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0.5"
    job = jobs("stall", MS_STALL, ["--state-dir", "{dir}/state", "--steps", "5", "--stall-at-step", "20",
                                   "--skew", "-0.05", "--stall-how", "sigstop,sleep"], msrun_env)
    rc = job.wait(260)
    job.assert_plugin_in_control()
    out = job.output()
    culprit = re.findall(r"hang: rank (\d+) \(pid \d+\) made no progress [^\n]*: the culprit; ([^\n]*)", out)
    assert [r for r, _ in culprit] == ["1", "1"], f"expected rank 1 alone named the culprit, twice\n{job.logs()}"
    assert "process is stopped" in culprit[0][1], job.logs()
    assert "stacks stop in the script's own code" in culprit[1][1], job.logs()
    assert "cannot tell which rank" not in out, job.logs()
    faults = re.findall(r"fault: rank (\d+) \(pid \d+\) stopped making progress", out)
    assert faults == ["1", "1"], f"faults reported {faults}, expected only rank 1, once per hang\n{job.logs()}"
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    counts = {rank: job.spawns(rank) for rank in (0, 1)}
    assert counts == {0: 3, 1: 3}, f"spawns per rank {counts}, expected 3 each (two job-reschedulings)\n{job.logs()}"
    state = job.dir / "state"
    for rank in (0, 1):
        assert files(state, f"done-rank{rank}-"), f"rank {rank} never finished after the restarts\n{job.logs()}"
    job.assert_nothing_left()


@pytest.mark.timeout(240)
def test_hung_rank_is_named_when_its_peer_gives_up_first_with_a_timeout_above_the_collectives(jobs, msrun_env):
    """Issue 37 item 1: TASKD_HEARTBEAT_TIMEOUT=300 (the docs' old advice) is above MindSpore's CPU collective
    timeout (MS_CPU_COMM_OP_TIMEOUT, 10 s here): taskd warns at the start. Rank 1 sleeps after step 20; rank 0
    waits in its AllReduce until MindSpore gives up and exits 1. That exit must not be blamed: taskd looks at
    the peer it waited on, names rank 1 the culprit (its stacks stop in the script), faults it first, and the
    job-rescheduling finishes the job."""
    msrun_env["TASKD_HEARTBEAT_TIMEOUT"] = "300"
    msrun_env["MS_CPU_COMM_OP_TIMEOUT"] = "10"
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0.5"
    job = jobs("above", MS_STALL, ["--state-dir", "{dir}/state", "--steps", "5", "--stall-at-step", "20",
                                   "--stall-how", "sleep"], msrun_env)
    rc = job.wait(200)
    job.assert_plugin_in_control()
    out = job.output()
    assert "is not below the ranks' collective timeout (10s)" in out, job.logs()
    culprit = re.findall(r"hang: rank (\d+) \(pid \d+\) made no progress [^\n]*: the culprit; ([^\n]*)", out)
    assert [r for r, _ in culprit] == ["1"], f"expected rank 1 named the culprit\n{job.logs()}"
    assert "stacks stop in the script's own code" in culprit[0][1], job.logs()
    assert "rank 0 (pid" in culprit[0][1] and "exited after waiting" in culprit[0][1], job.logs()
    faults = re.findall(r"fault: rank (\d+) \(pid \d+\) ([^\n]*)", out)
    assert [r for r, _ in faults] == ["1", "0"], f"expected rank 1's hang first, then rank 0's exit\n{job.logs()}"
    assert "waited on hung rank(s) [1]" in faults[1][1], job.logs()
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    for rank in (0, 1):
        assert files(job.dir / "state", f"done-rank{rank}-"), f"rank {rank} never finished\n{job.logs()}"
    job.assert_nothing_left()


TRAIN_MODEL = REPO / "examples" / "mindspore" / "train_model.py"


def rank_checkpoints(job: MsrunJob, rank: int) -> list[Path]:
    return sorted((job.dir / "ckpt" / f"rank_{rank}").glob("net*.ckpt"))


@pytest.mark.timeout(420)
def test_model_train_with_no_settings_names_a_stopped_then_a_sleeping_rank_with_true_step_counts(jobs, msrun_env):
    """Issues 18 item 5 and 37: examples/mindspore/train_model.py (Model.train, sharded GeneratorDataset,
    ModelCheckpoint every epoch handed to TaskdCallback), one launch, two hangs, and no taskd setting at all
    (hang detection is on by default under msrun, its timeout derived from the step times). First rank 1 is
    SIGSTOPped after its first checkpoint (a stopped process: a hang at once); then, in the rescheduled job, it
    sleeps in a callback of its own at its launch's step 28, so only TaskdCallback's per-step heartbeats and its
    stacks reveal it. Both times rank 1 alone is named and faulted (never rank 0, whose collective would give
    up after MS_CPU_COMM_OP_TIMEOUT), each fault is one job-rescheduling, the resumption lines count global
    steps (a resume from epoch k is at step 8k+, and redoes at most the 8 steps since the checkpoint), msrun
    exits 0, and the final weights are equal on both ranks."""
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0.5"
    args = ["--epochs", "5", "--steps-per-epoch", "8", "--ckpt-dir", "{dir}/ckpt", "--out", "{dir}/out",
            "--step-sleep", "0.15", "--hang-once-at-step", "28", "--fault-rank", "1"]
    job = jobs("model", TRAIN_MODEL, args, msrun_env)
    wait_for("rank 1's first checkpoint", lambda: rank_checkpoints(job, 1), 180, job)
    victim = job.rank_process(1)
    assert victim is not None, job.logs()
    victim.suspend()
    rc = job.wait(300)
    job.assert_plugin_in_control()
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    counts = {rank: job.spawns(rank) for rank in (0, 1)}
    assert counts == {0: 3, 1: 3}, f"spawns per rank {counts}, expected 3 each (two job-reschedulings)\n{job.logs()}"
    out = job.output()
    named = re.findall(r"hang: rank (\d+) \(pid \d+\) made no progress [^\n]*: the culprit; ([^\n]*)", out)
    assert [r for r, _ in named] == ["1", "1"], f"expected rank 1 named the culprit twice\n{job.logs()}"
    assert "process is stopped" in named[0][1], job.logs()
    assert "stacks stop in the script's own code" in named[1][1], job.logs()
    assert "cannot tell which rank" not in out, job.logs()
    faults = re.findall(r"fault: rank (\d+) \(pid \d+\)", out)
    assert faults == ["1", "1"], f"faults reported {faults}, expected only rank 1, once per hang\n{job.logs()}"
    resumed = re.findall(r"rank (\d) at step (\d+), step (\d+) (?:before the fault|when stopped)"
                         r"(?:: it redoes at least (\d+) step)?", out)
    assert len(resumed) == 4, f"expected both ranks' resumption twice\n{job.logs()}"
    for rank, seen, before, redone in resumed:  # global steps: past the checkpoint resumed from, within one epoch
        assert int(seen) > 8 and int(before) >= 8, f"rank {rank}: step {seen} (before: {before})\n{job.logs()}"
        assert not redone or 1 <= int(redone) <= 8, f"rank {rank} redoes {redone} steps\n{job.logs()}"
    for rank in (0, 1):
        log = (job.log_dir / f"worker_{rank}.log").read_text(errors="replace")
        # msrun truncates a rank's log at each spawn: this is the third incarnation's, resumed past the
        # first checkpoint the first restart resumed from
        epochs = [int(e) for e in re.findall(rf"rank {rank} resumed from epoch (\d+)", log)]
        assert epochs and epochs[0] > 1, f"rank {rank} did not resume after the hang ({epochs})\n{job.logs()}"
        assert f"rank {rank} done" in log, job.logs()
    weights = [np.load(job.dir / "out" / f"rank_{r}.npy") for r in (0, 1)]
    assert np.array_equal(weights[0], weights[1]), "the data-parallel ranks ended with different weights"
    job.assert_nothing_left()


@pytest.mark.timeout(120)
def test_invalid_setting_takes_control_and_fails_with_exit_2_naming_it(jobs, msrun_env):
    """Issue 13 item 5: TASKD_MONITOR_INTERVAL=0 must not make msrun supervise the job unprotected: the
    plugin takes control, starts no rank, names the setting in one line, exits 2 and reaps the scheduler."""
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0"
    job = jobs("bad-setting", DUMMY, ["--state-dir", "{dir}/state", "--duration", "5",
                                      "--scheduler-holds-port", "60"], msrun_env)
    rc = job.wait(90)
    job.assert_plugin_in_control()
    assert rc == 2, f"msrun exited {rc}, expected 2 for an invalid setting\n{job.logs()}"
    named = [ln for ln in job.output().splitlines() if "TASKD_MONITOR_INTERVAL" in ln]
    assert len(named) == 1 and "must be > 0" in named[0], f"expected one line naming the setting\n{job.logs()}"
    state = job.dir / "state"
    assert not started(state, 0) and not started(state, 1), f"a rank started\n{job.logs()}"
    job.assert_nothing_left()


def time_wait_on(port: int) -> int:
    """TCP connections of the port in TIME_WAIT (psutil reads /proc/net/tcp; no root needed)."""
    return sum(1 for c in psutil.net_connections("tcp") if c.status == psutil.CONN_TIME_WAIT
               and port in (c.laddr.port if c.laddr else None, c.raddr.port if c.raddr else None))


@pytest.mark.timeout(300)
def test_job_rescheduling_after_the_scheduler_died_starts_a_fresh_one(jobs, msrun_env):
    """msrun's scheduler is SIGKILLed mid-training, then rank 1. The plugin recorded the scheduler when it
    took control, so the job-rescheduling starts a fresh one from that record (without one the new ranks
    would retry "Failed to connect to the meta server node" for ever): msrun exits 0, in bounded time."""
    train = ["--steps", "30", "--ckpt-every", "10", "--ckpt-dir", "{dir}/ckpt", "--out", "{dir}/out",
             "--step-sleep", "0.1"]
    job = jobs("no-scheduler", TRAIN_DP, train, msrun_env)
    first_ckpt = job.dir / "ckpt" / "rank_1" / "step10.ckpt"
    victim = wait_for("rank 1 past its first checkpoint", lambda: first_ckpt.exists() and job.rank_process(1),
                      150, job)
    scheduler = job.scheduler_process()
    assert scheduler is not None, f"no scheduler process found\n{job.logs()}"
    scheduler.kill()
    wait_for("the scheduler to be gone", lambda: job.scheduler_process() is None, 10, job)
    victim.kill()
    killed = time.monotonic()

    rc = job.wait(120)
    took = time.monotonic() - killed
    job.assert_plugin_in_control()
    assert rc == 0, f"msrun exited {rc} after its scheduler and rank 1 were killed\n{job.logs()}"
    assert "job-rescheduling" in job.output(), f"no job-rescheduling in msrun's output\n{job.logs()}"
    assert "msrun's scheduler had exited; started a fresh one" in job.output(), job.logs()
    weights = [np.load(job.dir / "out" / f"rank_{rank}.npy") for rank in (0, 1)]
    assert np.array_equal(weights[0], weights[1]), "the two ranks' final weights differ"
    for rank in (0, 1):
        log = (job.log_dir / f"worker_{rank}.log").read_text(errors="replace")
        assert "resumed from step" in log, f"rank {rank} did not resume from a checkpoint\n{job.logs()}"
    job.assert_nothing_left()
    print(f"msrun exited {took:.1f}s after the kills")


@pytest.mark.timeout(240)
def test_heartbeat_dir_of_a_sigkilled_msrun_is_removed_by_the_next_one(jobs, msrun_env, tmp_path):
    """With TASKD_HEARTBEAT_TIMEOUT the plugin makes its heartbeat directory in msrun's --log_dir (not $TMPDIR).
    msrun SIGKILLed cannot remove it; the next msrun with that --log_dir removes it at start (its owner is
    dead), and removes its own at its end (it makes one whatever the settings: issue 37)."""
    tmp = tmp_path / "hb-tmp"
    tmp.mkdir()
    msrun_env["TMPDIR"] = str(tmp)
    hang_env = {**msrun_env, "TASKD_HEARTBEAT_TIMEOUT": "30"}
    first = jobs("shared", DUMMY, ["--state-dir", "{dir}/state", "--duration", "60"], hang_env)
    made = wait_for("the heartbeat directory in --log_dir", lambda: list(first.log_dir.glob("taskd-heartbeat-*")),
                    60, first)
    wait_for("both ranks to start", lambda: started(first.dir / "state", 0) and started(first.dir / "state", 1),
             90, first)
    assert not list(tmp.glob("taskd-*")), f"a taskd directory in $TMPDIR: {list(tmp.iterdir())}"
    os.kill(first.proc.pid, signal.SIGKILL)  # msrun alone: its plugin cannot clean up
    first.proc.wait(timeout=30)
    first.kill()  # the rest of the job (scheduler, ranks)
    assert all(p.is_dir() for p in made), "the heartbeat directory vanished although its msrun was SIGKILLed"

    msrun_env["MINDX_TASK_ID"] = f"msrun-test-{uuid.uuid4().hex[:8]}"
    second = jobs("shared", DUMMY, ["--state-dir", "{dir}/state2", "--duration", "1"], msrun_env)
    rc = second.wait(120)
    second.assert_plugin_in_control()
    assert rc == 0, f"the second msrun failed ({rc})\n{second.logs()}"
    assert not any(p.exists() for p in made), f"the SIGKILLed msrun's {made[0].name} was not removed"
    assert not list(second.log_dir.glob("taskd-heartbeat-*")), "the second msrun left its heartbeat directory"
    assert not list(tmp.glob("taskd-*")), f"a taskd directory in $TMPDIR: {list(tmp.iterdir())}"
    second.assert_nothing_left()


@pytest.mark.timeout(180)
def test_rank_finishing_slowly_after_its_work_is_not_called_hung(jobs, msrun_env):
    """Each rank's atexit handler sleeps 4 s without heartbeats (as MindSpore's finalisation does), longer than
    TASKD_HEARTBEAT_TIMEOUT=2: the rank marked itself finishing at exit, so no hang, no fault, msrun exits 0
    after every rank ran its exit handler to the end."""
    msrun_env.update({"TASKD_HEARTBEAT_TIMEOUT": "2", "TASKD_MONITOR_INTERVAL": "0.2"})
    job = jobs("slow-exit", SLOW_EXIT, ["--state-dir", "{dir}/state", "--exit-sleep", "4"], msrun_env)
    rc = job.wait(120)
    job.assert_plugin_in_control()
    out = job.output()
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    assert "hang:" not in out and "fault:" not in out, f"a finishing rank was taken for hung\n{job.logs()}"
    state = job.dir / "state"
    for rank in (0, 1):
        assert job.spawns(rank) == 1, f"rank {rank} was restarted\n{job.logs()}"
        assert files(state, f"exited-rank{rank}-"), f"rank {rank}'s exit handler did not run to its end"
    job.assert_nothing_left()


TRAIN_LINGER = REPO / "tests" / "mindspore_scripts" / "train_dp_linger.py"


@pytest.mark.timeout(240)
def test_rank_lingering_after_its_peer_exited_is_not_called_hung_by_the_derived_timeout(jobs, msrun_env):
    """No hang setting (the derived timeout: 10x the slowest step, at least 5 s). Rank 0 finishes and exits;
    rank 1 sleeps 10 s after its last step (writing results, a slow teardown) with no peer waiting on it. CI
    saw the 2-node form of this failed as a hang ("no recovery without them"): the derived timeout judges a
    stall only when it sees one (a stopped rank, or a second quiet rank). msrun exits 0, no fault."""
    msrun_env.pop("TASKD_HEARTBEAT_TIMEOUT", None)
    msrun_env["TASKD_MONITOR_INTERVAL"] = "0.5"
    args = ["--linger-rank", "1", "--linger", "10", "--steps", "12", "--ckpt-every", "6", "--ckpt-dir", "{dir}/ckpt",
            "--out", "{dir}/out", "--step-sleep", "0.05"]
    job = jobs("linger", TRAIN_LINGER, args, msrun_env)
    rc = job.wait(180)
    job.assert_plugin_in_control()
    out = job.output()
    assert rc == 0, f"msrun exited {rc}\n{job.logs()}"
    assert "rank 1 lingers" in (job.log_dir / "worker_1.log").read_text(errors="replace"), job.logs()
    assert "hang:" not in out and "fault:" not in out, f"the lingering rank was taken for hung\n{job.logs()}"
    assert job.spawns(1) == 1, f"rank 1 was restarted\n{job.logs()}"
    job.assert_nothing_left()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("finished", [True, False], ids=["said-finished", "exit-only"])
def test_rank_stuck_finishing_is_killed_at_the_bound_and_said_so(jobs, msrun_env, finished: bool):
    """The exit handler sleeps 120 s: the agent waits heartbeat timeout (2 s) + stop grace (1 s) after the rank
    marked itself finishing, kills it and says so. A rank that called taskd.worker.finished() counts as done
    (msrun exits 0, no restart); one that only began to exit is a fault (no restart budget: msrun fails)."""
    msrun_env.update({"TASKD_HEARTBEAT_TIMEOUT": "2", "TASKD_MONITOR_INTERVAL": "0.2", "TASKD_STOP_GRACE": "1",
                      "TASKD_MAX_RESTARTS": "0"})
    args = ["--state-dir", "{dir}/state", "--exit-sleep", "120", *(["--finished"] if finished else [])]
    job = jobs("stuck-exit", SLOW_EXIT, args, msrun_env)
    rc = job.wait(90)
    job.assert_plugin_in_control()
    out = job.output()
    what = "said its work was done" if finished else "began to exit"
    killed = [ln for ln in out.splitlines() if what in ln and "killed it" in ln]
    # said-finished: both ranks are killed at the bound; exit-only: the first one's fault ends the job
    assert len(killed) == 2 if finished else killed, f"no rank named as killed while finishing\n{job.logs()}"
    assert "hang:" not in out, f"a finishing rank was called hung\n{job.logs()}"
    if finished:
        assert rc == 0, f"msrun exited {rc} although both ranks had finished their work\n{job.logs()}"
        assert all("its work counts as finished" in ln for ln in killed), killed
        assert "fault:" not in out, job.logs()
    else:
        assert rc != 0, f"msrun exited 0 although no rank exited\n{job.logs()}"
        assert "fault: rank" in out, job.logs()
    state = job.dir / "state"
    for rank in (0, 1):
        assert job.spawns(rank) == 1, f"rank {rank} was restarted\n{job.logs()}"
        assert files(state, f"done-rank{rank}-") and not files(state, f"exited-rank{rank}-")
    job.assert_nothing_left()
