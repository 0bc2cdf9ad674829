"""One-line option errors (issue 8 item 7)."""
