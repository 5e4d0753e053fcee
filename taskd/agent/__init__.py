"""The per-node agent: supervises the ranks a launcher started and drives their recovery."""
