"""A node's snapshots as files: copied to its buddy's agent, and fetched back for a lost node."""
