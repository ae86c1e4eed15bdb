"""Benchmarks, run as `python manage.py bench NAME --json`; not part of CI.

Each module `bench/<name>.py` defines `add_arguments(parser)` (optional) and
`run(options: dict) -> dict`, which returns the figures as one JSON-able dict.
Compare figures as ratios measured in the same run: these machines are shared.
"""
