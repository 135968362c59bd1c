# SPDX-License-Identifier: Apache-2.0
"""A stand-in for Mooncake's Python package (the `mooncake` of its wheels):
only `mooncake.store`, for the tests of encache's route through Mooncake's
Python client where no Mooncake is installed (tests/python/
test_mooncake_python.py).  tests/mooncake_real checks it answers as the
real client does."""
