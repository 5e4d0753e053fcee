"""Strategy lists are bounded and their repeats dropped before they reach the state machine."""

from __future__ import annotations

from taskd.controller.service.validation import MAX_STRATEGY_NAMES, check_strategies, unique


def test_repeats_are_dropped_and_the_order_kept() -> None:
    assert unique(["recover", "exit", "recover", "retry", "exit"]) == ("recover", "exit", "retry")


def test_a_list_longer_than_the_bound_is_refused_naming_the_strategies() -> None:
    assert check_strategies(["exit"] * MAX_STRATEGY_NAMES) == ""
    why = check_strategies(["exit"] * (MAX_STRATEGY_NAMES + 1), "strategies")
    assert why.startswith(f"strategies has {MAX_STRATEGY_NAMES + 1} entries (max {MAX_STRATEGY_NAMES}")
    assert "exit" in why
