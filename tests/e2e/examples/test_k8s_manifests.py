"""examples/k8s/ validates strictly against Kubernetes' own schemas (issue 32 F10), and its exit-code rules read
`taskd run`'s codes right: a job taskd failed because a rank was SIGKILLed is not retried as a SIGKILLed pod.

kubernetes-validate ships the schemas in its package: no network. It is in the `test` extra (setup.cfg)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from taskd.process.exitcodes import job_exit_code

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install .[test])")

K8S = Path(__file__).resolve().parents[3] / "examples" / "k8s"
VERSIONS = ("1.31.0", "1.33.0")  # train-job.yaml needs 1.31 (podFailurePolicy GA); the newest the schemas cover


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["controller.yaml", "secret.yaml", "train-job.yaml"])
def test_manifest_validates_strictly(name: str, version: str) -> None:
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        if doc:
            kv.validate(doc, version, strict=True)  # raises ValidationError naming the field


def test_podfailurepolicy_retries_only_a_pod_whose_taskd_run_was_sigkilled() -> None:
    """The FailJob rule's exceptions are exactly 0 and 137 (taskd run itself SIGKILLed, e.g. the OOM killer);
    no failed job's exit code is 137, whatever its rank died of."""
    for doc in yaml.safe_load_all((K8S / "train-job.yaml").read_text()):
        if not doc or doc["kind"] != "Job":
            continue
        rules = doc["spec"]["podFailurePolicy"]["rules"]
        fail = [r for r in rules if r["action"] == "FailJob"]
        assert len(fail) == 1 and fail[0]["onExitCodes"]["operator"] == "NotIn", rules
        assert sorted(fail[0]["onExitCodes"]["values"]) == [0, 137], rules
    for signum in range(1, 65):
        assert job_exit_code(-signum) < 128 and job_exit_code(128 + signum) < 128
    assert job_exit_code(-9) == 109 and job_exit_code(1) == 1 and job_exit_code(None) == 1
