"""Revisions of the flowrun schema, oldest first (``0001_initial`` → ...)."""
