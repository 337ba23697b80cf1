"""The contention benchmark: dataset reads against checkpoint bursts on one shared bottleneck.

``python -m loadtests.contention`` (``make bench-contention``) runs the matrix (a) clients direct to the
store, (b) through s3lanes with lanes only, (c) through s3lanes with lanes and the write spool, on a testbed
where a write burst really queues reads behind it, and, for storage pools, (d) through s3lanes
(lanes + spool) with the checkpoint bucket routed to a second store behind its own bottleneck, (e) the same
split with the clients direct to the two stores. It writes a Markdown table, PNG plots and the raw numbers
under ``results/contention-<timestamp>/``. Modules:

- :mod:`.testbed`: the shared bottleneck. ``netns`` (root): three network namespaces and one tbf FIFO on a
  router, SeaweedFS in the server namespace (plus a second router and server for (d)/(e)); ``model`` (no
  root): an asyncio relay that pushes every byte, both directions, through one rate-limited FIFO (a second
  relay and SeaweedFS for (d)/(e)). Also the small processes the testbeds run (the SeaweedFS agent, the
  relay).
- :mod:`.workload`: the clients: a steady open-loop reader of range GETs (the latency probe) and a trainer
  simulation (a prefetching data loader, a fixed step rate, a synchronous checkpoint every N seconds).
- :mod:`.run`: the orchestration: testbed, store, gateways, the matrix in interleaved rounds, sampling.
- :mod:`.report`: the summary (pure), the Markdown report and the plots.

Results and their interpretation: ``docs/benchmarks.md``, "Contention benchmark".
"""
