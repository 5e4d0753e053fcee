"""Old path of the jittered backoff; the code lives in taskd.client.retry."""

from taskd.client.retry import Backoff

__all__ = ["Backoff"]
