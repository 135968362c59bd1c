/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keys.c: the protocol:v3 namespace and key (docs/format.md).
 *
 * The namespace is the components below joined by '@', in this order:
 * [prefix] "embedding" "model:M" "revision:R" "encoder:E" "dtype:torch.T"
 * "protocol:v3".  Nothing is escaped or hashed: components may themselves
 * contain '@' and ':', exactly as vLLM writes them.  Both functions write
 * into the caller's buffer and never allocate.
 */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Appends s to the output being built; tracks the length it would need
 * even when the buffer is too small, so that a size query is the same
 * code path as a real write. */
typedef struct {
  char *buf;
  size_t size;
  size_t len;
} out_t;

static void put(out_t *o, const char *s) {
  size_t n = strlen(s);
  if (o->len < o->size && n < o->size - o->len)
    memcpy(o->buf + o->len, s, n);
  o->len += n;
}

static int finish(out_t *o) {
  if (o->len > INT_MAX - 1)
    return ENCACHE_EINVAL;
  if (o->buf == NULL && o->size == 0)
    return (int)o->len;
  if (o->len >= o->size) {
    if (o->size > 0)
      o->buf[0] = '\0';
    return ENCACHE_ENOBUFS;
  }
  o->buf[o->len] = '\0';
  return (int)o->len;
}

static int nonempty(const char *s) { return s != NULL && s[0] != '\0'; }

int encache_namespace(const encache_namespace_params *given, char *buf,
                      size_t size) {
  encache_namespace_params full;
  if (given == NULL ||
      encache__struct_in(&full, sizeof(full), given, sizeof(full)) < 0)
    return ENCACHE_EINVAL;
  const encache_namespace_params *p = &full;
  if (p->model == NULL || (buf == NULL && size != 0))
    return ENCACHE_EINVAL;
  const char *torch = encache_dtype_torch_name(p->dtype);
  if (torch == NULL)
    return ENCACHE_EDTYPE;

  out_t o = {buf, size, 0};
  if (nonempty(p->prefix)) {
    put(&o, p->prefix);
    put(&o, "@");
  }
  put(&o, "embedding@model:");
  put(&o, p->model);
  put(&o, "@revision:");
  put(&o, nonempty(p->revision) ? p->revision : "default");
  put(&o, "@encoder:");
  put(&o, nonempty(p->encoder_hash) ? p->encoder_hash : "encoder:default");
  put(&o, "@dtype:");
  put(&o, torch);
  put(&o, "@protocol:v3");
  return finish(&o);
}

int encache_key(const char *ns, const char *id, char *buf, size_t size) {
  if (ns == NULL || !nonempty(id) || (buf == NULL && size != 0))
    return ENCACHE_EINVAL;
  out_t o = {buf, size, 0};
  put(&o, ns);
  put(&o, "@id:");
  put(&o, id);
  return finish(&o);
}

/* --------------------------------------------------------- encoder hash */

/*
 * MD5 (RFC 1321), for the one thing vLLM hashes into keys: the
 * multimodal-config factors.  Not for security; short inputs only.
 */
typedef struct {
  uint32_t h[4];
  uint64_t len;
  unsigned char blk[64];
  size_t n;
} md5_ctx;

static uint32_t rol(uint32_t x, unsigned c) { return x << c | x >> (32 - c); }

static void md5_block(md5_ctx *c, const unsigned char *b) {
  /* k[i] = floor(2^32 * |sin(i + 1)|) (RFC 1321). */
  static const uint32_t k[64] = {
      0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee,
      0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
      0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be,
      0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
      0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa,
      0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
      0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
      0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
      0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c,
      0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
      0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05,
      0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
      0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039,
      0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
      0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1,
      0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
  };
  static const unsigned shift[4][4] = {
      {7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};
  uint32_t w[16], a = c->h[0], bb = c->h[1], cc = c->h[2], d = c->h[3];
  for (int i = 0; i < 16; i++)
    w[i] = encache__get_le32(b + 4 * i);
  for (int i = 0; i < 64; i++) {
    uint32_t f;
    int g, r = i / 16;
    switch (r) {
    case 0: f = (bb & cc) | (~bb & d); g = i; break;
    case 1: f = (d & bb) | (~d & cc); g = (5 * i + 1) % 16; break;
    case 2: f = bb ^ cc ^ d; g = (3 * i + 5) % 16; break;
    default: f = cc ^ (bb | ~d); g = (7 * i) % 16; break;
    }
    uint32_t t = d;
    d = cc;
    cc = bb;
    bb = bb + rol(a + f + k[i] + w[g], shift[r][i % 4]);
    a = t;
  }
  c->h[0] += a;
  c->h[1] += bb;
  c->h[2] += cc;
  c->h[3] += d;
}

static void md5_update(md5_ctx *c, const void *data, size_t n) {
  const unsigned char *p = data;
  c->len += n;
  while (n > 0) {
    size_t take = 64 - c->n < n ? 64 - c->n : n;
    memcpy(c->blk + c->n, p, take);
    c->n += take;
    p += take;
    n -= take;
    if (c->n == 64) {
      md5_block(c, c->blk);
      c->n = 0;
    }
  }
}

static void md5_hex(const void *data, size_t n, char out[33]) {
  md5_ctx c = {{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476}, 0, {0}, 0};
  md5_update(&c, data, n);
  uint64_t bits = c.len * 8;
  unsigned char pad[72] = {0x80};
  size_t padlen = (c.n < 56 ? 56 : 120) - c.n;
  md5_update(&c, pad, padlen);
  unsigned char lenle[8];
  encache__put_le64(lenle, bits);
  md5_update(&c, lenle, 8);
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    uint32_t word = c.h[i / 4];
    unsigned byte = (word >> (8 * (i % 4))) & 0xff;
    out[2 * i] = hex[byte >> 4];
    out[2 * i + 1] = hex[byte & 15];
  }
  out[32] = '\0';
}

/* Appends Python's repr() of s (NULL: None) to o, for the printable ASCII
 * strings accepted here: single quotes unless s holds a ' and no ", a
 * backslash and the chosen quote escaped, as Python's str() of a list
 * writes its items.  Returns 0, or ENCACHE_EINVAL for a byte that is not
 * printable ASCII. */
static int put_repr(out_t *o, const char *s) {
  if (s == NULL) {
    put(o, "None");
    return 0;
  }
  char q = strchr(s, '\'') != NULL && strchr(s, '"') == NULL ? '"' : '\'';
  char one[3] = {q, 0, 0};
  put(o, one);
  for (const char *c = s; *c; c++) {
    if (*c < 0x20 || *c > 0x7e)
      return ENCACHE_EINVAL;
    one[0] = *c;
    one[1] = 0;
    if (*c == q || *c == '\\') {
      one[0] = '\\';
      one[1] = *c;
    }
    put(o, one);
  }
  one[0] = q;
  one[1] = 0;
  put(o, one);
  return 0;
}

/* The backend name as vLLM's AttentionBackendEnum[value.upper()] names it
 * into name[0..size), or NULL for none; "" on a refused name. */
static const char *backend_name(const char *given, char *name, size_t size) {
  if (given == NULL || given[0] == '\0')
    return NULL;
  size_t n = strlen(given);
  if (n >= size)
    return "";
  for (size_t i = 0; i <= n; i++) {
    char ch = given[i];
    if (ch >= 'a' && ch <= 'z')
      ch = (char)(ch - 'a' + 'A');
    else if (i < n && !(ch == '_' || (ch >= 'A' && ch <= 'Z') ||
                        (ch >= '0' && ch <= '9')))
      return "";
    name[i] = ch;
  }
  return name;
}

int encache_vllm_mm_hash(const encache_vllm_mm_config *given, char *buf,
                         size_t size) {
  encache_vllm_mm_config c = {sizeof(c), 0, NULL, NULL, NULL, NULL};
  if (given != NULL &&
      encache__struct_in(&c, sizeof(c), given, sizeof(c)) < 0)
    return ENCACHE_EINVAL;
  int factors = c.factors == ENCACHE_VLLM_MM_FACTORS_NEWEST
                    ? ENCACHE_VLLM_MM_FACTORS_4
                    : c.factors;
  const char *tp = c.tp_mode != NULL ? c.tp_mode : "weights";
  if ((factors != 1 && factors != 2 && factors != 4) ||
      (strcmp(tp, "weights") != 0 && strcmp(tp, "data") != 0))
    return ENCACHE_EINVAL;
  if (buf == NULL || size < 33)
    return ENCACHE_ENOBUFS;
  char name[96], text[1024];
  const char *backend = backend_name(c.attn_backend, name, sizeof(name));
  if (backend != NULL && backend[0] == '\0')
    return ENCACHE_EINVAL;
  /* vLLM writes str(factors): "[" items joined by ", " "]". */
  out_t o = {text, sizeof(text), 0};
  int bad = 0;
  put(&o, "[");
  bad |= put_repr(&o, backend) < 0;
  if (factors >= 2) {
    put(&o, ", ");
    bad |= put_repr(&o, tp) < 0;
  }
  if (factors == 4) {
    put(&o, ", ");
    bad |= put_repr(&o, c.attn_dtype) < 0;
    put(&o, ", ");
    bad |= put_repr(&o, c.fp8_scale_path) < 0;
  }
  put(&o, "]");
  if (bad || finish(&o) < 0)
    return ENCACHE_EINVAL;
  md5_hex(text, o.len, buf);
  return 32;
}

int encache_vllm_encoder_hash(const char *tp_mode, const char *attn_backend,
                              char *buf, size_t size) {
  if (tp_mode == NULL)
    return ENCACHE_EINVAL;
  encache_vllm_mm_config c = {sizeof(c), ENCACHE_VLLM_MM_FACTORS_2, tp_mode,
                              attn_backend, NULL, NULL};
  return encache_vllm_mm_hash(&c, buf, size);
}
