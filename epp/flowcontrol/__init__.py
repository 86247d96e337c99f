"""Flow control: requests that find no room wait here. :mod:`.saturation` says when an
endpoint is full and what a request's priority is, :mod:`.holding` what a held request
waits for, :mod:`.queues` is the order and limits (bands, fairness, deadlines): those
three are pure, and scheduling reads them. :mod:`.controller` does the waiting, the
timers and the counting (docs/flow-control.md)."""
