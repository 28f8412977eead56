"""Example flows shared by the jobs (``jobs/*.py``, thin CLIs), the demo, the tests and the
benchmarks: importable wherever rayflow is installed, so step actors on any node find them."""
