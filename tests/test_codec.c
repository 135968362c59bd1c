/* SPDX-License-Identifier: Apache-2.0 */
/* The v3 object header: the vectors of docs/format.md, acceptance cases 3, 8
 * and 10 of docs/behaviour.md. */
#include "runner.h"

#include "encache.h"

static const unsigned char vector_2x2[40] = {
    0x4e, 0x4f, 0x4f, 0x4d, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00,
    0x00, 0x40, 0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40};

/* Builds an object of header + payload for a contiguous matrix. */
static size_t build(unsigned char *obj, int dtype, int64_t rows, int64_t cols,
                    const void *payload) {
  int64_t shape[2] = {rows, cols};
  encache_tensor t = {sizeof t, payload, dtype, 2, shape, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, obj), 0);
  size_t n = (size_t)(rows * cols) * encache_dtype_size(dtype);
  memcpy(obj + ENCACHE_HEADER_SIZE, payload, n);
  return ENCACHE_HEADER_SIZE + n;
}

TEST(codec_normative_vector) {
  /* The payload bytes of the vector are little-endian floats; write them
   * byte by byte so the test holds on any host. */
  unsigned char obj[40];
  size_t len = build(obj, ENCACHE_FLOAT32, 2, 2, vector_2x2 + 24);
  ASSERT_EQ_INT(len, 40);
  ASSERT_EQ_MEM(obj, vector_2x2, 40);
  encache_contract c = {ENCACHE_FLOAT32, 2, 2};
  encache_header h;
  ASSERT_EQ_INT(encache_object_check(vector_2x2, 40, &c, &h),
                ENCACHE_COMPATIBLE);
  ASSERT_EQ_U64(h.magic, ENCACHE_MAGIC);
  ASSERT_EQ_U64(h.rows, 2);
  ASSERT_EQ_U64(h.cols, 2);
  /* And the host's own floats agree when the host is little-endian. */
  float f[4] = {1, 2, 3, 4};
  const unsigned one = 1;
  if (*(const unsigned char *)&one == 1)
    ASSERT_EQ_MEM(f, vector_2x2 + 24, 16);
}

TEST(codec_roundtrip_every_dtype) {
  /* Acceptance case 3: bit-exact round trips, length 24 + nbytes, with
   * awkward bit patterns (NaN payloads, -0, denormals, infinities). */
  static const uint16_t half_bits[] = {0x0000, 0x8000, 0x7c00, 0xfc00,
                                       0x7e01, 0x0001, 0x3c00, 0xabcd};
  static const uint32_t f32_bits[] = {0x00000000u, 0x80000000u, 0x7f800000u,
                                      0x7fc00001u, 0x00000001u, 0x3f800000u,
                                      0xdeadbeefu, 0xffffffffu};
  const struct {
    int dtype;
    const void *data;
  } cases[] = {{ENCACHE_FLOAT32, f32_bits},
               {ENCACHE_FLOAT16, half_bits},
               {ENCACHE_BFLOAT16, half_bits}};
  for (size_t k = 0; k < 3; k++) {
    unsigned char obj[24 + 32];
    size_t len = build(obj, cases[k].dtype, 2, 4, cases[k].data);
    uint64_t nbytes;
    ASSERT_EQ_INT(encache_payload_size(cases[k].dtype, 2, 4, &nbytes), 0);
    ASSERT_EQ_U64(len, 24 + nbytes);
    encache_contract c = {cases[k].dtype, 2, 4};
    ASSERT_EQ_INT(encache_object_check(obj, len, &c, NULL),
                  ENCACHE_COMPATIBLE);
    ASSERT_EQ_MEM(obj + 24, cases[k].data, nbytes);
    ASSERT_EQ_U64(obj[4], (unsigned)cases[k].dtype);
  }
}

TEST(codec_refuses_non_matrices) {
  /* Acceptance case 8: a 3-D output is refused before anything is
   * written; so are other dtypes and strided layouts. */
  unsigned char out[24];
  memset(out, 0xAA, sizeof(out));
  int64_t shape3[3] = {2, 2, 2};
  encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 3, shape3, NULL, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ESHAPE);
  t.ndim = 1;
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ESHAPE);
  int64_t neg[2] = {-1, 4};
  t.ndim = 2;
  t.shape = neg;
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ESHAPE);
  int64_t shape[2] = {4, 8};
  t.shape = shape;
  t.dtype = 1; /* not float32/float16/bfloat16 */
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_EDTYPE);
  t.dtype = ENCACHE_FLOAT16;
  int64_t transposed[2] = {1, 4};
  t.strides = transposed;
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ECONTIG);
  int64_t padded_rows[2] = {16, 1}; /* a view of 8 columns of 16 */
  t.strides = padded_rows;
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ECONTIG);
  for (size_t i = 0; i < sizeof(out); i++)
    ASSERT_EQ_INT(out[i], 0xAA);
  int64_t huge[2] = {INT64_MAX, 4};
  t.shape = huge;
  t.strides = NULL;
  ASSERT_EQ_INT(encache_header_encode(&t, out), ENCACHE_ETOOLARGE);
}

TEST(codec_contiguity_as_pytorch) {
  unsigned char out[24];
  int64_t one_row[2] = {1, 8};
  int64_t odd[2] = {12345, 1};
  encache_tensor t = {sizeof t, NULL, ENCACHE_FLOAT32, 2, one_row, odd, 0, 0, NULL};
  ASSERT_EQ_INT(encache_header_encode(&t, out), 0); /* size-1 dim: any stride */
  int64_t shape[2] = {3, 8};
  int64_t dense[2] = {8, 1};
  t.shape = shape;
  t.strides = dense;
  ASSERT_EQ_INT(encache_header_encode(&t, out), 0);
  int64_t empty[2] = {0, 8};
  t.shape = empty;
  t.strides = odd;
  ASSERT_EQ_INT(encache_header_encode(&t, out), 0);
  ASSERT_EQ_U64(out[8], 0);
}

TEST(codec_incompatible_objects) {
  /* Acceptance case 10, header validation: each defect is named, checked
   * in the order length, magic, dtype, shape. */
  float payload[4] = {1, 2, 3, 4};
  unsigned char good[40], obj[64];
  build(good, ENCACHE_FLOAT32, 2, 2, payload);
  encache_contract c = {ENCACHE_FLOAT32, 2, 2};
  encache_header h;

  ASSERT_EQ_INT(encache_object_check(good, 40, &c, &h), ENCACHE_COMPATIBLE);
  /* shape: 2x2 is not a 4x1 hit although the sizes agree */
  encache_contract c41 = {ENCACHE_FLOAT32, 4, 1};
  ASSERT_EQ_INT(encache_object_check(good, 40, &c41, &h), ENCACHE_BAD_SHAPE);
  ASSERT_EQ_U64(h.rows, 2);
  /* dtype: a float16 2x4 has the same length as a float32 2x2 */
  uint16_t h16[8] = {0};
  build(obj, ENCACHE_FLOAT16, 2, 4, h16);
  encache_contract c24 = {ENCACHE_FLOAT32, 2, 4};
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c24, NULL),
                ENCACHE_BAD_LENGTH); /* float32 2x4 needs 56 bytes */
  encache_contract c24h = {ENCACHE_BFLOAT16, 2, 4};
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c24h, &h), ENCACHE_BAD_DTYPE);
  ASSERT_EQ_U64(h.dtype, ENCACHE_FLOAT16);
  /* magic */
  memcpy(obj, good, 40);
  obj[0] ^= 1;
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c, NULL), ENCACHE_BAD_MAGIC);
  /* short header, short data, long data */
  ASSERT_EQ_INT(encache_object_check(good, 23, &c, &h), ENCACHE_BAD_LENGTH);
  ASSERT_EQ_U64(h.magic, 0);
  ASSERT_EQ_INT(encache_object_check(good, 0, &c, NULL), ENCACHE_BAD_LENGTH);
  ASSERT_EQ_INT(encache_object_check(good, 39, &c, NULL), ENCACHE_BAD_LENGTH);
  memcpy(obj, good, 40);
  ASSERT_EQ_INT(encache_object_check(obj, 41, &c, NULL), ENCACHE_BAD_LENGTH);
  /* a valid object still loads after all that */
  ASSERT_EQ_INT(encache_object_check(good, 40, &c, NULL), ENCACHE_COMPATIBLE);
  /* bad contracts are argument errors, not verdicts */
  encache_contract bad = {7, 2, 2};
  ASSERT_EQ_INT(encache_object_check(good, 40, &bad, NULL), ENCACHE_EDTYPE);
  ASSERT_EQ_INT(encache_object_check(good, 40, NULL, NULL), ENCACHE_EINVAL);
  ASSERT_EQ_STR(encache_verdict_name(ENCACHE_BAD_SHAPE), "shape");
  ASSERT_EQ_STR(encache_verdict_name(42), "unknown");
}

TEST(codec_decode_is_endian_independent) {
  /* Big values in every byte position decode the same on any host. */
  unsigned char obj[24] = {0x4e, 0x4f, 0x4f, 0x4d, 0x0c, 0, 0, 0,
                           1, 2, 3, 4, 5, 6, 7, 8,
                           0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80};
  encache_header h;
  ASSERT_EQ_INT(encache_header_decode(obj, 24, &h), 0);
  ASSERT_EQ_U64(h.magic, 0x4D4F4F4Eu);
  ASSERT_EQ_U64(h.dtype, 12);
  ASSERT_EQ_U64(h.rows, 0x0807060504030201ull);
  ASSERT_EQ_U64(h.cols, 0x8070605040302010ull);
  ASSERT_EQ_INT(encache_header_decode(obj, 23, &h), ENCACHE_EINCOMPAT);
}

TEST(codec_describe) {
  char msg[160];
  ASSERT_EQ_INT(encache_object_describe(vector_2x2, 40, msg, sizeof(msg)), 0);
  ASSERT_EQ_STR(msg, "float32 2x2, 16 payload bytes");
  ASSERT_EQ_INT(encache_object_describe(vector_2x2, 10, msg, sizeof(msg)),
                ENCACHE_EINCOMPAT);
  ASSERT_CONTAINS(msg, "shorter than the 24-byte header");
  ASSERT_EQ_INT(encache_object_describe(vector_2x2, 36, msg, sizeof(msg)),
                ENCACHE_EINCOMPAT);
  ASSERT_CONTAINS(msg, "needs 40 bytes, object has 36");
  unsigned char obj[40];
  memcpy(obj, vector_2x2, 40);
  obj[4] = 5;
  ASSERT_EQ_INT(encache_object_describe(obj, 40, msg, sizeof(msg)),
                ENCACHE_EINCOMPAT);
  ASSERT_CONTAINS(msg, "unknown dtype code 5");
  obj[4] = 0;
  obj[3] = 0;
  encache_object_describe(obj, 40, msg, sizeof(msg));
  ASSERT_CONTAINS(msg, "bad magic 0x004f4f4e");
  /* A tiny buffer is still NUL-terminated. */
  char tiny[4];
  encache_object_describe(vector_2x2, 40, tiny, sizeof(tiny));
  ASSERT_EQ_STR(tiny, "flo");
}

TEST(codec_payload_size_overflow) {
  uint64_t n;
  ASSERT_EQ_INT(encache_payload_size(ENCACHE_FLOAT32, UINT64_MAX, 2, &n),
                ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(encache_payload_size(ENCACHE_FLOAT32, 1ull << 62, 1, &n),
                ENCACHE_ETOOLARGE);
  ASSERT_EQ_INT(encache_payload_size(ENCACHE_FLOAT16, 3, 5, &n), 0);
  ASSERT_EQ_U64(n, 30);
  ASSERT_EQ_INT(encache_payload_size(3, 1, 1, &n), ENCACHE_EDTYPE);
}

/* docs/format.md: the wire constants, and one object of each 16-bit dtype
 * (the float16 one is vLLM's own header test; the bfloat16 one holds 1.0
 * and -2.0). */
TEST(codec_vector_constants_and_16bit_objects) {
  ASSERT_EQ_INT(ENCACHE_HEADER_SIZE, 24);
  ASSERT_EQ_U64(ENCACHE_MAGIC, 0x4D4F4F4Eu);
  ASSERT_EQ_INT(ENCACHE_FLOAT32, 0);
  ASSERT_EQ_INT(ENCACHE_FLOAT16, 11);
  ASSERT_EQ_INT(ENCACHE_BFLOAT16, 12);
  static const unsigned char f16_1x3[30] = {
      0x4e, 0x4f, 0x4f, 0x4d, 0x0b, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0,
      0x03, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x40};
  static const unsigned char bf16_1x2[28] = {
      0x4e, 0x4f, 0x4f, 0x4d, 0x0c, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0,
      0x02, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0x00, 0xc0};
  /* The payloads as the host holds them: 0, 1, 2 in float16 and 1.0, -2.0
   * in bfloat16.  Their bytes are the vector's on a little-endian host. */
  static const uint16_t f16[3] = {0x0000, 0x3c00, 0x4000};
  static const uint16_t bf16[2] = {0x3f80, 0xc000};
  const unsigned one = 1;
  const int little = *(const unsigned char *)&one == 1;
  unsigned char obj[32];
  ASSERT_EQ_INT(build(obj, ENCACHE_FLOAT16, 1, 3, f16), 30);
  ASSERT_EQ_MEM(obj, f16_1x3, little ? 30 : 24);
  encache_contract c16 = {ENCACHE_FLOAT16, 1, 3};
  ASSERT_EQ_INT(encache_object_check(f16_1x3, 30, &c16, NULL),
                ENCACHE_COMPATIBLE);
  ASSERT_EQ_INT(build(obj, ENCACHE_BFLOAT16, 1, 2, bf16), 28);
  ASSERT_EQ_MEM(obj, bf16_1x2, little ? 28 : 24);
  encache_contract cbf = {ENCACHE_BFLOAT16, 1, 2};
  ASSERT_EQ_INT(encache_object_check(bf16_1x2, 28, &cbf, NULL),
                ENCACHE_COMPATIBLE);
}

/* docs/format.md, "Judging an object": with two defects at once, the first
 * in the order length, magic, dtype, shape is the one reported. */
TEST(codec_vector_check_order) {
  encache_contract c = {ENCACHE_FLOAT32, 2, 2};
  unsigned char obj[48];
  /* length and magic wrong: length */
  memcpy(obj, vector_2x2, 40);
  obj[0] = 0;
  ASSERT_EQ_INT(encache_object_check(obj, 39, &c, NULL), ENCACHE_BAD_LENGTH);
  /* magic and dtype wrong, length right: magic */
  obj[4] = 12; /* bfloat16 */
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c, NULL), ENCACHE_BAD_MAGIC);
  /* dtype and shape wrong, length right (bfloat16 2x4 = float32 2x2 in
   * bytes): dtype */
  memcpy(obj, vector_2x2, 40);
  obj[4] = 12;
  obj[16] = 4;
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c, NULL), ENCACHE_BAD_DTYPE);
  /* only the shape wrong (4x1 has the 2x2's bytes): shape */
  memcpy(obj, vector_2x2, 40);
  obj[8] = 4;
  obj[16] = 1;
  ASSERT_EQ_INT(encache_object_check(obj, 40, &c, NULL), ENCACHE_BAD_SHAPE);
}
