"""The agent's round: the states a node goes through, the events and actions, the rules, the executors."""
