"""`epp top`: frame (the numbers, pure), render (one screen), command (the loop)."""
