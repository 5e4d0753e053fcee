"""Exceptions raised by the recover client.

Callers mostly need to tell "the controller is not there" (retry later, or run degraded) from
"the controller refused us" and from everything else, hence the small hierarchy.
"""

from __future__ import annotations


class RecoverClientError(Exception):
    """A call to the controller failed for a reason other than a status code."""


class HandedOver(RecoverClientError):
    """A re-Register refused while this client's node was being handed over (`RecoverClient.handing_over`, a node
    migration): another agent holds the node now, so the signal stream ends for good, as the hand-over meant."""


class ServerUnreachable(RecoverClientError, ConnectionError):
    """The controller did not answer: refused, unresolvable, or silent past the deadline.

    `known`: this client had answers from that address before. Then a closed or refused connection is the
    controller gone (killed, restarting, the network), said as such: the set-up hints (TLS, a connection
    limit, not a taskd controller) are for a connection that never worked, or a TLS handshake that failed."""

    def __init__(self, address: str, detail: str = "", known: bool = False) -> None:
        self.address = address
        self.detail = detail
        self.known = known
        if known and not _tls_words(detail):
            how = "closed the connection" if _closed_words(detail) else "is unreachable"
            super().__init__(f"the controller at {address} {how}" + (f" ({detail})" if detail else ""))
            return
        message = f"recovery controller at {address} is unreachable"
        if detail:
            message = f"{message}: {detail}"
        super().__init__(f"{message} ({unreachable_hint(detail)})")


def _tls_words(detail: str) -> bool:
    lowered = detail.lower()
    return any(word in lowered for word in ("handshake", "ssl", "tls", "certificate"))


def _closed_words(detail: str) -> bool:
    lowered = detail.lower()
    return any(word in lowered for word in ("socket closed", "connection reset", "eof", "stream removed"))


def unreachable_hint(detail: str) -> str:
    """What to check, from how the connection failed: nobody listening, or somebody who accepted and hung up."""
    if _closed_words(detail) or _tls_words(detail):
        return ("something accepted the connection and closed it: a controller that serves TLS (set TASKD_TLS_CA, "
                "or --tls-ca, to its CA), one at a connection limit (its log names the limit), or not a taskd "
                "controller at all")
    return "is `taskd server` running there? check MINDX_SERVER_IP, the port and any firewall"


class AuthenticationError(RecoverClientError):
    """The controller answered UNAUTHENTICATED: a missing or wrong token. Retrying cannot help."""

    def __init__(self, address: str, detail: str = "") -> None:
        self.address = address
        self.detail = detail
        hint = "" if "TASKD_TOKEN_FILE" in detail else (
            " (set TASKD_TOKEN_FILE to a file holding the token `taskd server --token-file` was given)")
        super().__init__(f"recovery controller at {address} refused this client's credentials: {detail}{hint}")


class ConfigurationError(RecoverClientError, ValueError):
    """The client cannot be built from what it was given (missing env variables, bad address, bad file)."""


class FencedError(RecoverClientError):
    """The controller answered 411 (FENCED): it declared this agent lost and its node is now another agent's
    (or awaits one). Nothing this process does for that node counts any more: stop every rank and exit."""

    def __init__(self, method: str, info: str) -> None:
        self.method = method
        self.info = info
        super().__init__(f"{method} refused: this agent was fenced by the controller: {info}")
