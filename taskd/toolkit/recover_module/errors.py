"""Old path of the client's exceptions; the code lives in taskd.client.errors."""

from taskd.client.errors import AuthenticationError, ConfigurationError, RecoverClientError, ServerUnreachable

__all__ = ["AuthenticationError", "ConfigurationError", "RecoverClientError", "ServerUnreachable"]
