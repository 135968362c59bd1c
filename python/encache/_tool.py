# SPDX-License-Identifier: Apache-2.0
"""The `encache` command of a pip install: runs the tool the wheel ships
(encache/_bin/encache, the same program as `cmake --install` puts in
bin/), with the arguments it was given."""
import os
import sys


def path():
    """Where the tool of this package is (it may be absent: a package
    laid out by a CMake build, not by pip)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin",
                        "encache")


def main():
    tool = path()
    if not os.access(tool, os.X_OK):
        sys.exit(f"encache: the tool is not installed beside this package "
                 f"({tool} is missing); install the package with pip, or "
                 f"run the encache that `cmake --install` put in bin/")
    # A Mooncake Store named on the command line or by ENCACHE_STORE takes
    # the route this Python has (Mooncake's C ABI, or its Python client:
    # encache/_mooncake.py); the tool inherits the environment it sets.
    from . import _mooncake
    for arg in sys.argv[1:] + [os.environ.get("ENCACHE_STORE", "")]:
        for part in arg.split("="):
            if _mooncake.names_mooncake(part):
                _mooncake.route(part)
    os.execv(tool, ["encache"] + sys.argv[1:])


if __name__ == "__main__":
    main()
