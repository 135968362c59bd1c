/*
 * keys.c: the protocol:v3 namespace and key (spec/v3-format.md).
 *
 * The namespace is the components below joined by '@', in this order:
 * [prefix] "embedding" "model:M" "revision:R" "encoder:E" "dtype:torch.T"
 * "protocol:v3".  Nothing is escaped or hashed: components may themselves
 * contain '@' and ':', exactly as vLLM writes them.  Both functions write
 * into the caller's buffer and never allocate.
 */
#include "internal.h"

#include <limits.h>
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

int encache_namespace(const encache_namespace_params *p, char *buf,
                      size_t size) {
  if (p == NULL || !nonempty(p->model) || (buf == NULL && size != 0))
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
