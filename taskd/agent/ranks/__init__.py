"""The ranks of one node: their table, their control through the launcher, live recovery and resumption."""
