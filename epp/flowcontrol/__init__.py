"""Flow control: requests that find no room wait here. :mod:`.queues` is the pure order
and limits (bands, fairness, deadlines); :mod:`.controller` does the waiting, the timers
and the counting (docs/flow-control.md)."""
