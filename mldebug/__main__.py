"""``python -m mldebug`` (also ``torchrun -m mldebug dist-test``)."""

from mldebug.cli import entry

if __name__ == "__main__":
    entry()
