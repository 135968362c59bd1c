# SPDX-License-Identifier: Apache-2.0
"""The exceptions of encache: one class per kind of library error.

Every exception the package raises for a library failure is an
``encache.Error``; ``code`` is the library's code (``include/encache.h``),
``name`` its name ("EPOISONED"), and the message is the library's detail.
"""

import re


class Error(Exception):
    """A failure reported by libencache (or by the binding)."""

    def __init__(self, message, code=None, name=None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.name = name


class ConfigError(Error):
    """A configuration the library refuses; ``field`` names the option."""

    _FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*)(?=: |:$| )")

    def __init__(self, message, code=None, name=None):
        super().__init__(message, code, name)
        m = self._FIELD.match(message or "")
        self.field = m.group(1) if m else None


class JsonError(ConfigError):
    """Malformed JSON in a configuration (the message has line and column)."""


class UrlError(Error):
    """An invalid Store URL."""


class StoreError(Error):
    """The Store failed (input/output error, unavailable, unconfirmed)."""


class FormatError(StoreError):
    """The Store holds an incompatible or corrupted format."""


class LibraryError(Error):
    """A library the Store needs (e.g. Mooncake's) cannot be loaded."""


class PoisonedError(Error):
    """The handle is poisoned: a Store operation's completion could not be
    confirmed, so the Store may still write into memory encache handed it.
    Every later call raises this; the process is expected to exit."""


class ClosedError(Error):
    """The Cache or the Step is closed."""


class StepsError(Error):
    """Too many steps are open on the Cache (close one first)."""


class InvalidError(Error, ValueError):
    """An invalid argument: a bad item, dtype, shape or tensor."""


class OutOfMemoryError(Error, MemoryError):
    """The library ran out of memory."""


class ForkError(Error):
    """A Cache (or Step) opened in a parent process was used after fork():
    open a new Cache in the child."""


def by_code(codes):
    """The map from library codes to classes, given the codes by name."""
    table = {
        "EINVAL": InvalidError, "EDTYPE": InvalidError, "ESHAPE": InvalidError,
        "ECONTIG": InvalidError, "ENOMEM": OutOfMemoryError,
        "ECONFIG": ConfigError, "EJSON": JsonError, "EURL": UrlError,
        "EIO": StoreError, "EUNAVAIL": StoreError, "EUNCONFIRMED": StoreError,
        "EFORMAT": FormatError, "ENOLIB": LibraryError,
        "EPOISONED": PoisonedError, "ECLOSED": ClosedError,
        "ESTEPS": StepsError,
        # A step's started lookup is not complete: Step.wait() returns
        # False for it, so it reaches nobody; a use error if it does.
        "EPENDING": InvalidError,
    }
    return {codes[name]: cls for name, cls in table.items() if name in codes}
