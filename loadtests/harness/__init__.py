"""Shared pieces of the benchmarks and load tests: the gateway as a process (alone or as a proxy stack in
front of SeaweedFS), the store, a signed raw client and a signed aiohttp one, checkpoint saves, statistics,
command-line helpers and machine facts. Benchmarks import these, never each other's internals."""
