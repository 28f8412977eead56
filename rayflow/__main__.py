"""``python -m rayflow``: the ``rayflow`` command."""

from rayflow.cli import main

if __name__ == "__main__":
    main(prog_name="rayflow")
