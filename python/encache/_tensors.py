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


def _torch_dtype_codes():
    global _torch_dtypes
    if _torch_dtypes is None:
        _torch_dtypes = _torch_codes(sys.modules["torch"])
    return _torch_dtypes


def _stream(value):
    """The library's stream argument for a CUDA stream handle: 0 (NULL) is
    the legacy default stream, as in the CUDA runtime."""
    return int(value or 0)


def _describe_torch(t):
    torch = sys.modules["torch"]
    if t.layout != torch.strided:
        raise InvalidError(
            f"a {t.layout} tensor cannot be published: publication reads "
            "a dense matrix (pass tensor.to_dense())")
    if t.is_cuda:
        torch = sys.modules["torch"]
        index = t.device.index if t.device.index is not None else 0
        # The output is ordered on the stream current for its device: the
        # library records an event there and copies once it has passed.
        place = (_encache.DEVICE_CUDA, index,
                 _stream(torch.cuda.current_stream(t.device).cuda_stream))
    elif t.is_cpu:
        place = (_encache.DEVICE_HOST, 0, 0)
    else:
        raise InvalidError(
            f"a tensor on {t.device} cannot be published: publication reads "
            "host or CUDA memory (pass tensor.cpu())")
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    # A CPU tensor's bytes are copied at the call (step_type.c); a CUDA
    # one's storage is kept until its write is reaped, though its bytes
    # are already copied on the stream at the call.
    return (t.data_ptr(), _torch_dtype_codes().get(t.dtype, -1), t.shape,
            t.stride(), st.data_ptr(), st.nbytes(), st) + place


# __cuda_array_interface__ type strings (there is none for bfloat16).
_CAI_CODES = {"<f4": "float32", "<f2": "float16"}


def _describe_cuda_array(obj, cai):
    """An object with a __cuda_array_interface__ (CuPy, Numba, ...)."""
    typestr = str(cai.get("typestr", ""))
    name = _CAI_CODES.get(typestr)
    code = _encache.dtype_parse(name) if name else -1
    shape = tuple(int(d) for d in cai["shape"])
    item = int(typestr[2:]) if typestr[2:].isdigit() else 1
    strides = cai.get("strides")
    if strides is not None:
        strides = tuple(s // item if s % item == 0 else -1 for s in strides)
    data = int(cai["data"][0] or 0)
    # The extent the view spans, as its storage.
    steps = strides if strides is not None else _contiguous(shape)
    span = 0 if 0 in shape else (
        1 + sum((d - 1) * abs(s) for d, s in zip(shape, steps))) * item
    # Version 3's stream: None (no synchronisation needed) and 1 both
    # mean the legacy default stream here; 2 is the per-thread one.
    stream = cai.get("stream")
    device = getattr(obj, "device", None)
    index = getattr(device, "id", getattr(device, "index", 0)) or 0
    return (data, code, shape, strides, data, span, obj,
            _encache.DEVICE_CUDA, int(index), 0 if stream in (None, 1)
            else _stream(stream))


def _contiguous(shape):
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _describe_numpy(a):
    item = a.itemsize
    strides = tuple(s // item if s % item == 0 else -1 for s in a.strides)
    code = _encache.dtype_parse(a.dtype.name)
    root = a
    while isinstance(root.base, type(a)):
        root = root.base
    base = root.__array_interface__["data"][0]
    return (a.__array_interface__["data"][0], code, a.shape, strides, base,
            root.nbytes, root, _encache.DEVICE_HOST, 0, 0)


def describe(obj):
    """(data, dtype code or -1, shape, strides in elements, storage base,
    storage bytes, what keeps the storage alive, device kind, device
    index, stream) of a tensor or array to publish."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _describe_torch(obj)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _describe_numpy(obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        return _describe_cuda_array(obj, cai)
    raise InvalidError(
        f"publish takes a torch.Tensor, a numpy.ndarray or an object with "
        f"a __cuda_array_interface__, not {type(obj).__name__}")


def device_empty(code, rows, cols, index):
    """(tensor, address, stream) of a new rows x cols torch tensor of dtype
    code on CUDA device index, for a lookup's destination, with the stream
    current there (the library copies hits on it, so the tensor is ordered
    as torch's own allocations are); None when torch cannot allocate on
    CUDA (not imported, or built without CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    dtype = {v: k for k, v in _torch_dtype_codes().items()}[code]
    device = torch.device("cuda", index)
    t = torch.empty((rows, cols), dtype=dtype, device=device)
    return (t, t.data_ptr(),
            _stream(torch.cuda.current_stream(device).cuda_stream))
