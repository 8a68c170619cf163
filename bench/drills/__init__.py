"""Fault drills (`make drills`, `python -m bench.drills`): see bench/drills/__main__.py."""
