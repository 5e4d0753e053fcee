"""The status credential an embedded controller's locator holds (issue 31, F4): its own kind, bound to its token."""

from __future__ import annotations

from taskd.controller.service.auth import STATUS_READER, authenticate, job_credential, status_credential


def test_the_status_credential_is_its_own_kind_and_bound_to_its_token() -> None:
    token = b"admin-token-for-tests-0123456789abcdef"
    bearer = [("authorization", f"Bearer {status_credential(token)}")]
    assert authenticate(bearer, token) == ("", STATUS_READER)
    assert status_credential(token).startswith("tds1.") and status_credential(token) != job_credential(token, "")
    why, scope = authenticate([("authorization", f"Bearer {status_credential(b'another-token-0123456789')}")], token)
    assert scope is None and "not made from this controller's token" in why
    assert authenticate([("authorization", f"Bearer {job_credential(token, 'j')}")], token) == ("", "j")
