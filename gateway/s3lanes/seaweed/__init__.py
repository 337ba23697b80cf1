"""Run a local SeaweedFS (``weed mini``): the embedded default backend and the test backend.

Two halves: :mod:`s3lanes.seaweed.options` (what to run: identities, options and their checks, s3.json) and
:mod:`s3lanes.seaweed.command` (the command line, its environment, the ports, the signed readiness HEAD) are
pure of processes and event loops; :mod:`s3lanes.seaweed.process` starts, supervises and stops weed.

Theory of operation: ``weed mini`` runs master, volume server, filer and S3 in one process. Left to its
defaults it binds every interface on fixed ports, so two instances on one machine collide and a developer
laptop exposes an unauthenticated store. We therefore pass *every* listener's port explicitly, bind them to
one loopback address, switch off the extras (WebDAV, Iceberg, Lance, admin UI, telemetry) and give S3 real
identities in ``state_dir/s3.json`` so that SigV4 is enforced exactly as on a real backend.

Ports are chosen by binding ``ip:0`` for each listener at once (so they are distinct) and closing the
sockets just before the spawn. Someone else can grab one in between; weed then exits at once with "Port
allocation failed", and :meth:`SeaweedProcess.start` retries the whole start once with fresh ports.

Readiness, in order, each probe bounded by a short timeout:

1. S3 answers an anonymous ``GET /`` with 403 (it is up and enforcing auth; a 200 would mean no auth);
2. the master lists at least one volume server (else the first PUT can fail with "no writable volumes");
3. every bucket of :attr:`SeaweedOptions.buckets` answers a *signed* ``HEAD /bucket`` with 200. weed
   creates them asynchronously after S3 is up. An anonymous HEAD cannot tell "missing" from "forbidden"
   (both 403), and asking the filer directly would not show what S3 itself sees, so we sign the HEAD
   with the gateway's own signer (``s3lanes.core.sigv4.sign_headers``; the runtime must not need boto3).

weed is started in its own session (``start_new_session``): a Ctrl-C in the terminal reaches the gateway
only, and the gateway stops weed in order (SIGTERM, wait, SIGKILL after a timeout). It is *not* tied to our
lifetime by PR_SET_PDEATHSIG (that fires when the spawning *thread* exits, and callers may well start weed
from a worker thread); instead ``state_dir/run/weed.pid`` records it, and a start refuses to run beside a
live weed on the same state directory (a gateway killed with -9 leaves its weed running). This module is
not a general process supervisor: it restarts nothing. :meth:`wait_exit` only reports a death so that the
caller can take the process down loudly.

Measured on the 2-core dev machine with SeaweedFS 4.48: S3 answers about 1 s after the spawn, SIGTERM to
exit takes about 4 s.
"""
