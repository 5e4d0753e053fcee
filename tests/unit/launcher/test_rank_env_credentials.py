"""A rank's environment never carries the controller's credentials, wherever they came from."""

from __future__ import annotations

from taskd.agent.link.controller import forget_credential_vars
from taskd.launcher.env import rank_env
from taskd.launcher.spec import WorkerSpec

CREDENTIALS = {"TASKD_TOKEN_FILE": "/etc/taskd/token", "TASKD_TLS_CA": "/ca.pem", "TASKD_TLS_CERT": "/c.pem",
               "TASKD_TLS_KEY": "/k.pem", "TASKD_TOKEN": "secret-0123456789abcdef"}


def test_credential_variables_of_the_agent_and_of_extra_env_are_dropped() -> None:
    spec = WorkerSpec(entrypoint=["python", "x.py"], nproc_per_node=1, extra_env={"TASKD_TLS_KEY": "/other.key"})
    env = rank_env(spec, 0, 0, None, base={**CREDENTIALS, "HOME": "/home/u", "TASKD_JOB_ID": "outer"})
    assert not set(CREDENTIALS) & set(env), env
    assert env["HOME"] == "/home/u" and env["RANK"] == "0"


def test_the_msrun_agent_forgets_the_variables_once_it_holds_the_credentials() -> None:
    environ = {**CREDENTIALS, "PATH": "/bin"}
    assert sorted(forget_credential_vars(environ)) == sorted(CREDENTIALS)
    assert environ == {"PATH": "/bin"}
