"""The operator contracts' earlier home, kept for code (and pickled checkpoints) written
against it: they live in :mod:`rayflow.core.operators`, which this name now is."""

import sys

from rayflow.core import operators as _core

sys.modules[__name__] = _core
