"""``epp serve --workers N``: one parent process and N ext_proc worker processes.

The parent keeps what must happen once (discovery, the admin API and the one HTTP port,
the state file, ejection, the /metrics scraper, ORCA streams); each worker runs an
ext_proc port with its own router, scheduler, in-flight accounting and KV-event
subscribers, fed the parent's membership and endpoint data over a unix socket
(docs/workers.md)."""
