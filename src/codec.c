/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec.c: the 24-byte protocol:v3 object header (docs/format.md).
 *
 * All fields are little-endian and are read and written byte by byte, so
 * the code is correct on any host whatever its byte order or alignment
 * rules.  An object is a hit only if its length, magic, dtype and shape
 * all match the reader's contract, checked in that order so that the
 * reported reason is the first thing that is wrong.
 */
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *encache_verdict_name(int verdict) {
  switch (verdict) {
  case ENCACHE_COMPATIBLE:
    return "compatible";
  case ENCACHE_BAD_LENGTH:
    return "length";
  case ENCACHE_BAD_MAGIC:
    return "magic";
  case ENCACHE_BAD_DTYPE:
    return "dtype";
  case ENCACHE_BAD_SHAPE:
    return "shape";
  default:
    return "unknown";
  }
}

int encache_payload_size(int dtype, uint64_t rows, uint64_t cols,
                         uint64_t *nbytes) {
  size_t item = encache_dtype_size(dtype);
  if (item == 0)
    return ENCACHE_EDTYPE;
  uint64_t elems;
  if (__builtin_mul_overflow(rows, cols, &elems))
    return ENCACHE_ETOOLARGE;
  uint64_t bytes;
  if (__builtin_mul_overflow(elems, (uint64_t)item, &bytes) ||
      bytes > UINT64_MAX - ENCACHE_HEADER_SIZE)
    return ENCACHE_ETOOLARGE;
  if (nbytes != NULL)
    *nbytes = bytes;
  return 0;
}

static void header_write(unsigned char *out, uint32_t dtype, uint64_t rows,
                         uint64_t cols) {
  encache__put_le32(out, ENCACHE_MAGIC);
  encache__put_le32(out + 4, dtype);
  encache__put_le64(out + 8, rows);
  encache__put_le64(out + 16, cols);
}

int encache_header_encode(const encache_tensor *given,
                          unsigned char out[ENCACHE_HEADER_SIZE]) {
  encache_tensor full;
  if (given == NULL || out == NULL ||
      encache__struct_in(&full, sizeof(full), given,
                         ENCACHE__TENSOR_MIN) < 0)
    return ENCACHE_EINVAL;
  const encache_tensor *t = &full;
  if (encache_dtype_size(t->dtype) == 0)
    return ENCACHE_EDTYPE;
  if (t->ndim != 2 || t->shape == NULL || t->shape[0] < 0 || t->shape[1] < 0)
    return ENCACHE_ESHAPE;
  uint64_t rows = (uint64_t)t->shape[0], cols = (uint64_t)t->shape[1];
  /* Contiguity as PyTorch defines it: the stride of a dimension of size 1
   * does not matter, nor does any stride of an empty tensor. */
  if (t->strides != NULL && rows != 0 && cols != 0) {
    if (cols != 1 && t->strides[1] != 1)
      return ENCACHE_ECONTIG;
    if (rows != 1 && (uint64_t)t->strides[0] != cols)
      return ENCACHE_ECONTIG;
  }
  int rc = encache_payload_size(t->dtype, rows, cols, NULL);
  if (rc < 0)
    return rc;
  header_write(out, (uint32_t)t->dtype, rows, cols);
  return 0;
}

int encache_header_decode(const void *obj, size_t len, encache_header *hdr) {
  if (hdr == NULL || (obj == NULL && len != 0))
    return ENCACHE_EINVAL;
  memset(hdr, 0, sizeof(*hdr));
  if (len < ENCACHE_HEADER_SIZE)
    return ENCACHE_EINCOMPAT;
  const unsigned char *p = obj;
  hdr->magic = encache__get_le32(p);
  hdr->dtype = encache__get_le32(p + 4);
  hdr->rows = encache__get_le64(p + 8);
  hdr->cols = encache__get_le64(p + 16);
  return 0;
}

int encache_object_check(const void *obj, size_t len,
                         const encache_contract *c, encache_header *hdr) {
  encache_header local;
  uint64_t nbytes;
  if (c == NULL)
    return ENCACHE_EINVAL;
  int rc = encache_payload_size(c->dtype, c->rows, c->cols, &nbytes);
  if (rc < 0)
    return rc == ENCACHE_ETOOLARGE ? ENCACHE_EINVAL : rc;
  if (hdr == NULL)
    hdr = &local;
  rc = encache_header_decode(obj, len, hdr);
  if (rc == ENCACHE_EINVAL)
    return rc;
  if (rc < 0 || (uint64_t)len != ENCACHE_HEADER_SIZE + nbytes)
    return ENCACHE_BAD_LENGTH;
  if (hdr->magic != ENCACHE_MAGIC)
    return ENCACHE_BAD_MAGIC;
  if (hdr->dtype != (uint32_t)c->dtype)
    return ENCACHE_BAD_DTYPE;
  if (hdr->rows != c->rows || hdr->cols != c->cols)
    return ENCACHE_BAD_SHAPE;
  return ENCACHE_COMPATIBLE;
}

int encache_object_describe(const void *obj, size_t len, char *buf,
                            size_t size) {
  encache_header h;
  uint64_t nbytes;
  int ok = 0;
  if (buf == NULL && size != 0)
    return ENCACHE_EINVAL;
  if (size == 0)
    buf = NULL;
  if (encache_header_decode(obj, len, &h) < 0) {
    if (buf)
      snprintf(buf, size,
               "not a v3 object: %zu bytes, shorter than the %d-byte header",
               len, ENCACHE_HEADER_SIZE);
  } else if (h.magic != ENCACHE_MAGIC) {
    if (buf)
      snprintf(buf, size, "not a v3 object: bad magic 0x%08" PRIx32
                          " (expected 0x%08x)", h.magic, ENCACHE_MAGIC);
  } else if (h.dtype > INT32_MAX || encache_dtype_size((int)h.dtype) == 0) {
    if (buf)
      snprintf(buf, size, "not a v3 object: unknown dtype code %" PRIu32,
               h.dtype);
  } else if (encache_payload_size((int)h.dtype, h.rows, h.cols, &nbytes) < 0) {
    if (buf)
      snprintf(buf, size,
               "not a v3 object: shape %" PRIu64 "x%" PRIu64 " overflows",
               h.rows, h.cols);
  } else if ((uint64_t)len != ENCACHE_HEADER_SIZE + nbytes) {
    if (buf)
      snprintf(buf, size,
               "not a v3 object: %s %" PRIu64 "x%" PRIu64
               " needs %" PRIu64 " bytes, object has %zu",
               encache_dtype_name((int)h.dtype), h.rows, h.cols,
               ENCACHE_HEADER_SIZE + nbytes, len);
  } else {
    ok = 1;
    if (buf)
      snprintf(buf, size, "%s %" PRIu64 "x%" PRIu64 ", %" PRIu64
                          " payload bytes", encache_dtype_name((int)h.dtype),
               h.rows, h.cols, nbytes);
  }
  return ok ? 0 : ENCACHE_EINCOMPAT;
}
