"""Shared pieces of the benchmarks and load tests: the gateway as a process, the store, a signed raw
client, statistics and machine facts."""
