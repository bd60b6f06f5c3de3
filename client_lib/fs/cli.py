"""The ``metaflow-fs`` command: the mount (`client_lib.fs.mount`) when the
``fs`` extra is installed, a clear message when it is not (the client extra
installs the command too, and nothing third-party)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from client_lib.fs.mount import main as mount
    except ImportError as exc:
        print(f"metaflow-fs needs the fs extra (trio): pip install 'metaflow-sdn[fs]' "
              f"({exc})", file=sys.stderr)
        return 2
    return mount(argv)


if __name__ == "__main__":
    sys.exit(main())
