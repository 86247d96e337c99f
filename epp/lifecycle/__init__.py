"""The request lifecycle: its owner's parts (admission, picking, the P/D hand-off),
the record a request carries through it, and the hooks observers register on."""
