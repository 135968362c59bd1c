# SPDX-License-Identifier: Apache-2.0
"""What the C half needs to know of torch tensors and NumPy arrays.

Neither framework is imported here: a tensor can only exist if its
framework is already in ``sys.modules``.  The functions are called by
encache._encache: ``dtype_of`` and ``device_of`` once per distinct object
(the extension caches their answers), ``describe`` once per publication.
"""

import sys

from . import _encache
from ._errors import InvalidError


def dtype_of(obj):
    """The library's code of a dtype given as a torch dtype, a NumPy dtype
    (or type), or a name ("bfloat16", "torch.float16", "fp32", ...)."""
    name = obj if isinstance(obj, str) else None
    if name is None and type(obj).__module__ == "torch":
        name = str(obj)
    if name is None and "numpy" in sys.modules:
        try:
            name = sys.modules["numpy"].dtype(obj).name
        except TypeError:
            name = None
    if name is not None:
        code = _encache.dtype_parse(name.lower())  # the library's names
        if code >= 0:
            return code
    raise InvalidError(
        f"dtype {obj!r} is not float32, float16 or bfloat16")


def device_of(obj):
    """(kind, index) of a device given as None, "cpu", "cuda", "cuda:N",
    an int (a CUDA index) or a torch.device."""
    if obj is None:
        return (_encache.DEVICE_HOST, 0)
    if isinstance(obj, int) and not isinstance(obj, bool) and obj >= 0:
        return (_encache.DEVICE_CUDA, obj)
    text = str(obj) if type(obj).__module__ == "torch" else obj
    if isinstance(text, str):
        kind, _, index = text.partition(":")
        if kind == "cpu" and not index:
            return (_encache.DEVICE_HOST, 0)
        if kind == "cuda" and (not index or index.isdigit()):
            return (_encache.DEVICE_CUDA, int(index or 0))
    raise InvalidError(f"device {obj!r} is not 'cpu', 'cuda' or 'cuda:N'")


def _torch_codes(torch):
    return {torch.float32: _encache.FLOAT32, torch.float16: _encache.FLOAT16,
            torch.bfloat16: _encache.BFLOAT16}


_torch_dtypes = None


def _describe_torch(t):
    global _torch_dtypes
    if not t.is_cpu:
        raise InvalidError(
            f"a tensor on {t.device} cannot be published: publication reads "
            "host memory (pass tensor.cpu())")
    if _torch_dtypes is None:
        _torch_dtypes = _torch_codes(sys.modules["torch"])
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    # The storage, not the tensor, is kept: a tensor can be given other
    # memory (set_, resize_) while its old memory is still being written.
    return (t.data_ptr(), _torch_dtypes.get(t.dtype, -1), t.shape, t.stride(),
            st.data_ptr(), st.nbytes(), st)


def _describe_numpy(a):
    item = a.itemsize
    strides = tuple(s // item if s % item == 0 else -1 for s in a.strides)
    code = _encache.dtype_parse(a.dtype.name)
    root = a
    while isinstance(root.base, type(a)):
        root = root.base
    base = root.__array_interface__["data"][0]
    return (a.__array_interface__["data"][0], code, a.shape, strides, base,
            root.nbytes, root)


def describe(obj):
    """(data, dtype code or -1, shape, strides in elements, storage base,
    storage bytes, what keeps the storage alive) of a CPU tensor or array
    to publish."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _describe_torch(obj)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _describe_numpy(obj)
    raise InvalidError(
        f"publish takes a torch.Tensor or a numpy.ndarray, not "
        f"{type(obj).__name__}")
