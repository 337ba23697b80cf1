"""Hostile input against a real gateway: malformed and hostile HTTP requests over raw sockets.

Run it as ``python -m loadtests.fuzz_http --cases 10000 --seed N`` (``--quick`` is the 600-case CI subset;
``--help`` lists the knobs). Results and what they mean live in ``docs/reliability.md`` ("Hostile input").

Theory of operation
-------------------
The script starts its own SeaweedFS (or uses one given with ``--backend-endpoint``), creates a bucket on it
directly, and starts a real ``s3lanes serve`` subprocess in front of it with the write spool on (spool and
state directories under one temporary directory, the process's working directory and ``TMPDIR`` there too)
and real credentials. Then it runs ``--cases`` cases, ``--concurrency`` at a time. A case is a short
sequence of exchanges on one keep-alive connection (a new one when the server closed it), written byte for
byte with asyncio streams, never through an HTTP library, because broken framing needs raw bytes. Each case
kind (:data:`KINDS`) mixes hostile requests with valid SigV4-signed ones (signed with
``s3lanes.core.sigv4.sign_headers``): broken, missing and duplicated Authorization, bad and skewed dates,
wrong payload hashes and digests, truncated, oversized and mis-framed bodies, bad aws-chunked framing and
trailers, invalid ranges and part numbers, odd keys (``..``, ``.``, ``//``, ``%00``, ``%2F``, raw non-UTF-8
bytes, 1 KiB of unicode, control characters, keys over 1024 bytes), bad XML for CompleteMultipartUpload and
DeleteObjects, unknown query parameters, odd methods, HTTP/1.0, pipelining and garbage that is not HTTP.

A case's randomness comes from ``random.Random(f"{seed}-{index}")`` and every key a case touches lies under
``<marker>/c<index>/`` (the marker is derived from the seed), so cases are independent and
``--seed N --only-case I`` replays case I alone, printing every request and answer: that is the reproducer.

Every answer is classified: its status; for an error (>= 400, not HEAD) whether the body is S3 error XML
with a ``<Code>``; whether it came from the S3 handler (it carries ``x-amz-request-id``) or from the HTTP
parser below it; and whether status and code are among those the case expects (S3's answer for that input).
After the hostile part of a case, a valid request checks that nothing was lost: the object a hostile write
tried to replace still reads back byte for byte, and a valid request on the same connection still gets its
own answer (no request desynchronisation).

Ground truth is kept in a ledger: every object a *valid* request completely wrote (its MD5 and ETag), every
key deleted, every multipart upload a case left open on purpose, and the keys whose last write has no
certain outcome (no answer came, or S3 leaves the meaning open): those may hold either version. At the end
the script flushes the spool (``POST /_s3lanes/flush``; it stops waiting once the pending count stops
falling: an acknowledged write that can never drain is a missing object), lists the bucket and its
multipart uploads straight on SeaweedFS with boto3, and compares. SeaweedFS's own handling of keys ending
in ``/`` (``PUT a/b/`` with data is kept as ``a/b/b``, or with a few bytes as an empty ``a/b/``; direct
requests to it do the same) is reported apart, not as partial objects. It snapshots the file system before
and after (the temporary directory outside the spool and state directories, the gateway's working directory
and ``TMPDIR``, the top level of ``/tmp`` and of the current directory; keys aim path traversals at
``/tmp/<marker>...``, so anything named after the marker counts wherever it appears), and scans the
gateway's logs for tracebacks. A gateway that dies is a crash: recorded with the cases in flight, then
restarted on the same state directory (its recovery replays the journal) so that the run goes on.

The figures that must be 0 (the exit status is 1 otherwise): crashes (the gateway process died, or did not
exit 0 on SIGTERM), 500 answers, files created outside the spool and state directories, partial or
unexpected objects on the backend, acknowledged objects missing from it, multipart uploads left open on the
backend that no case left open, read-backs that differ from what valid writes left, wrong answers (bytes
that are not the slice a 200/206 names, injected headers, a 200 whose XML does not parse), desynchronised
connections, tracebacks in the gateway's logs and errors of this harness itself. Reported beside them: 503
answers (acceptable only if justified), other 5xx, answers outside the expected set (and of those, the ones
the store gave and the gateway relayed), error answers without S3 XML, answers of the HTTP parser below the
S3 handler, timeouts.
"""
