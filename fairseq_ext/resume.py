"""Resuming training safely (issue 8, items 3 and 6). Filled in by the resume work."""
