"""Tests for p2ptrain (run: python3 -m unittest discover -s tests -v)."""
