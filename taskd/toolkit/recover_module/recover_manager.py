"""TaskD's module path for the recover client; the code lives in taskd.client (docs/client.md)."""

from taskd.client.current import (
    get_manager,
    get_recover_manager_instance,
    init_grpc_recover_manager,
    manager_from_env,
    report_finished,
    report_process_fault,
    report_recover_status,
    report_recover_strategy,
    report_stop_complete,
    set_manager,
)
from taskd.client.dispatch import SignalHandler
from taskd.client.errors import AuthenticationError, ConfigurationError, RecoverClientError, ServerUnreachable
from taskd.client.manager import DEFAULT_ROLE, DLRecoverManager, RecoverClient
from taskd.client.retry import BUSY_CODES, REREGISTER_CODES
from taskd.client.rpc import DEFAULT_CHANNEL_OPTIONS
from taskd.client.signals import RecoverSignal, fault_ranks_from_proto, fault_ranks_to_proto, parse_signal

__all__ = ["AuthenticationError", "BUSY_CODES", "ConfigurationError", "DEFAULT_CHANNEL_OPTIONS", "DEFAULT_ROLE",
           "DLRecoverManager", "REREGISTER_CODES", "RecoverClient", "RecoverClientError", "RecoverSignal",
           "ServerUnreachable", "SignalHandler", "fault_ranks_from_proto", "fault_ranks_to_proto", "get_manager",
           "get_recover_manager_instance", "init_grpc_recover_manager", "manager_from_env", "parse_signal",
           "report_finished", "report_process_fault", "report_recover_status", "report_recover_strategy",
           "report_stop_complete", "set_manager"]
