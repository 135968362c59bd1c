/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Commands that drive the engine through the public API, for operators
 * debugging a deployment: lookup and publish.
 */
#include "commands.h"
#include "ns.h"

#include "cuda_rt.h"
#include "encache.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Destinations from malloc, for the tool's own lookups. */
static int host_alloc(void *ctx, size_t i, const encache_candidate *c,
                      uint64_t nbytes, void **data, void **handle) {
  (void)ctx;
  (void)i;
  (void)c;
  *handle = NULL;
  *data = malloc(nbytes ? (size_t)nbytes : 1);
  return *data ? 0 : ENCACHE_ENOMEM;
}

static void host_release(void *ctx, size_t i, void *data, void *handle) {
  (void)ctx;
  (void)i;
  (void)handle;
  free(data);
}

static const encache_allocator host_allocator = {
    sizeof(encache_allocator), NULL, host_alloc, host_release, 0};

/* lookup --device cuda:N: destinations in that device's memory, allocated
 * through the CUDA runtime the tool loads as the library does
 * (tools/bench/cuda_rt.c); NULL ctx: no runtime (the library then answers
 * SKIPPED with the reason, and alloc is never called). */
static int device_alloc(void *ctx, size_t i, const encache_candidate *c,
                        uint64_t nbytes, void **data, void **handle) {
  (void)i;
  cuda_rt *rt = ctx;
  *handle = NULL;
  if (rt == NULL || rt->set_device(c->device_index) != 0 ||
      rt->malloc_(data, nbytes ? (size_t)nbytes : 1) != 0)
    return ENCACHE_ENOMEM;
  return 0;
}

static void device_release(void *ctx, size_t i, void *data, void *handle) {
  (void)i;
  (void)handle;
  cuda_rt *rt = ctx;
  if (rt != NULL)
    rt->free_(data);
}

/* Parses --device: "host" (0) or "cuda:N" (1, *index = N); -1 after a
 * message. */
static int device_arg(const char *v, int *index) {
  long long n;
  *index = 0;
  if (v == NULL || strcmp(v, "host") == 0)
    return 0;
  if (strncmp(v, "cuda:", 5) != 0)
    return usage_error("lookup", "--device: '%s' is neither host nor cuda:N",
                       v), -1;
  if (tool_int("lookup", "--device cuda:", v + 5, 0, 15, &n) < 0)
    return -1;
  *index = (int)n;
  return 1;
}

/* free() as a storage release callback. */
static void free_data(void *p) { free(p); }

/* The engine calls of lookup and publish, each in one place: one step
 * (opened on *step, closed by the caller) looks up c[0..n). */
static int engine_lookup(encache *ec, encache_step **step,
                         const encache_candidate *c, size_t n,
                         encache_result *res, const encache_allocator *a) {
  for (size_t i = 0; i < n; i++)
    res[i].size = sizeof(res[i]);
  int rc = encache_step_open(ec, step);
  return rc < 0 ? rc : encache_lookup(*step, c, n, a, res);
}

static int engine_publish(encache_step *step, const char *id,
                          const encache_tensor *v, encache_storage *s) {
  return encache_publish(step, id, v, s);
}

static void engine_stats(encache *ec, encache_stats *st) {
  st->size = sizeof(*st);
  encache_stats_get(ec, st);
}

/* --rows and --cols of lookup and publish. */
enum { E_ROWS = NS_COUNT_, E_COLS, E_ID, E_DEVICE = E_ID /* lookup's */ };

static const tool_opt lookup_opts[] = {
    TOOL_NS_OPTS, [E_ROWS] = {"rows", 1}, [E_COLS] = {"cols", 1},
    [E_DEVICE] = {"device", 1}, {NULL, 0}};

static const tool_opt publish_opts[] = {TOOL_NS_OPTS, [E_ROWS] = {"rows", 1},
                                        [E_COLS] = {"cols", 1},
                                        [E_ID] = {"id", 1}, {NULL, 0}};

/* The namespace options and --rows/--cols; -1 after a message. */
static int engine_args(const char *cmd, const tool_args *a, ns_opts *o,
                       uint64_t *rows, uint64_t *cols) {
  long long v;
  if (a->val[E_ROWS] == NULL || a->val[E_COLS] == NULL)
    return usage_error(cmd, "--rows and --cols are required"), -1;
  if (tool_int(cmd, "--rows", a->val[E_ROWS], 1, LLONG_MAX, &v) < 0)
    return -1;
  *rows = (uint64_t)v;
  if (tool_int(cmd, "--cols", a->val[E_COLS], 1, LLONG_MAX, &v) < 0)
    return -1;
  *cols = (uint64_t)v;
  return ns_from_args(cmd, a, o);
}

/* Escapes s as a JSON string body into buf. */
static void json_escape(char *buf, size_t size, const char *s) {
  size_t w = 0;
  for (; *s && w + 7 < size; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      buf[w++] = '\\';
      buf[w++] = (char)ch;
    } else if (ch < 0x20) {
      w += (size_t)snprintf(buf + w, size - w, "\\u%04x", ch);
    } else {
      buf[w++] = (char)ch;
    }
  }
  buf[w] = '\0';
}

static const char lookup_usage[] =
    "usage: encache [--store URL] lookup --model M [--prefix P] [--revision R]\n"
    "           [--encoder-hash H | --vllm-mm-* ...]\n"
    "           [--config JSON|@FILE] --dtype DTYPE\n"
    "           --rows N --cols N [--device host|cuda:N] [--json] ID...\n"
    "\n"
    "Looks the identifiers up as an encoder would (one batched existence\n"
    "check, chunked reads, validation against DTYPE ROWSxCOLS) and prints one\n"
    "line per identifier: 'ID HIT DTYPE ROWS COLS', or 'ID OUTCOME CAUSE' when\n"
    "it is not a hit: MISS, INCOMPATIBLE (and what did not match), OVERSIZE\n"
    "(both sizes), UNAVAILABLE (the Store's message: a wrong password, a\n"
    "refused connection, ...), SKIPPED (the rule).  --json adds the cause as\n"
    "\"why\".  --config takes the vLLM ec-transfer-config (its prefix, model\n"
    "identity and limits) in place of --prefix.  --device cuda:N reads the\n"
    "hits into memory of CUDA device N, through the CUDA runtime loaded at\n"
    "run time ($ENCACHE_CUDA_LIBRARY, else libcudart.so); without one they\n"
    "are SKIPPED with the reason.  Exit 0 when the Store\n"
    "answered, even if nothing was a hit; 1 when it could not be opened, an\n"
    "outcome is UNAVAILABLE or the lookup failed.\n";

/* Prints one result (as a JSON object when json is set): a non-HIT with
 * the library's cause (result.why). */
static void print_result(const encache_candidate *c, const encache_result *r,
                         int json, size_t i) {
  char id[1024], why[1024];
  const char *dt = encache_dtype_name(c->dtype);
  const char *cause = r->outcome == ENCACHE_HIT ? NULL
                      : r->why != NULL         ? r->why
                                               : "no cause given";
  if (json) {
    json_escape(id, sizeof(id), c->id);
    printf("%s\n {\"id\": \"%s\", \"outcome\": \"%s\"", i ? "," : "", id,
           encache_outcome_name(r->outcome));
    if (r->outcome == ENCACHE_HIT)
      printf(", \"dtype\": \"%s\", \"rows\": %" PRIu64 ", \"cols\": %" PRIu64
             ", \"bytes\": %" PRIu64, dt, c->rows, c->cols, r->nbytes);
    if (cause != NULL) {
      json_escape(why, sizeof(why), cause);
      printf(", \"why\": \"%s\"", why);
    }
    if (r->outcome == ENCACHE_INCOMPATIBLE)
      printf(", \"mismatch\": \"%s\", \"verdict\": \"%s\"", why,
             encache_verdict_name(r->verdict));
    printf("}");
  } else if (r->outcome == ENCACHE_HIT) {
    printf("%s HIT %s %" PRIu64 " %" PRIu64 "\n", c->id, dt, c->rows, c->cols);
  } else {
    printf("%s %s %s\n", c->id, encache_outcome_name(r->outcome), cause);
  }
}

/* Closes ec; a failure turns a success into EXIT_FAIL. */
static int close_engine(const char *cmd, encache *ec, int exit_code) {
  if (encache_close(ec) < 0 && exit_code == EXIT_OK) {
    fprintf(stderr, "encache %s: %s\n", cmd, encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  }
  return exit_code;
}

static int run_lookup(const tool_globals *g, const tool_args *a) {
  ns_opts o;
  uint64_t rows, cols;
  int dev_index, device = device_arg(a->val[E_DEVICE], &dev_index);
  if (device < 0 || engine_args("lookup", a, &o, &rows, &cols) < 0)
    return EXIT_USAGE;
  static cuda_rt rt;
  char why[256];
  encache_allocator alloc = {sizeof(alloc), NULL, device_alloc, device_release, 0};
  if (device && cuda_rt_load(&rt, why, sizeof(why)) == 0)
    alloc.ctx = &rt; /* else the library says why: SKIPPED */
  int exit_code = EXIT_OK;
  encache *ec = open_engine("lookup", g, &o, 1, &exit_code);
  if (ec == NULL)
    return exit_code;
  size_t n = (size_t)a->argc;
  encache_candidate *cands = calloc(n, sizeof(*cands));
  encache_result *res = calloc(n, sizeof(*res));
  if (cands == NULL || res == NULL) {
    fprintf(stderr, "encache lookup: out of memory\n");
    free(cands);
    free(res);
    return close_engine("lookup", ec, EXIT_FAIL);
  }
  for (size_t i = 0; i < n; i++) {
    encache_candidate cc = {sizeof(cc), a->argv[i], ENCACHE_MODALITY_IMAGE,
                            o.dtype, rows, cols,
                            device ? ENCACHE_DEVICE_CUDA : ENCACHE_DEVICE_HOST,
                            dev_index};
    cands[i] = cc;
  }
  encache_step *step = NULL;
  if (engine_lookup(ec, &step, cands, n, res,
                    device ? &alloc : &host_allocator) < 0) {
    fprintf(stderr, "encache lookup: %s\n", encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  } else {
    if (g->json)
      printf("[");
    for (size_t i = 0; i < n; i++) {
      print_result(&cands[i], &res[i], g->json, i);
      if (device && res[i].data != NULL)
        device_release(alloc.ctx, i, res[i].data, NULL);
      else
        free(res[i].data);
      /* The Store failed: the lookup did not answer (as stats exits 1
       * when it cannot reach the Store). */
      if (res[i].outcome == ENCACHE_UNAVAILABLE)
        exit_code = EXIT_FAIL;
    }
    if (g->json)
      printf("\n]\n");
  }
  encache_step_close(step);
  free(cands);
  free(res);
  return close_engine("lookup", ec, exit_code);
}

static const char publish_usage[] =
    "usage: encache [--store URL] publish --model M [--prefix P] [--revision R]\n"
    "           [--encoder-hash H | --vllm-mm-* ...]\n"
    "           [--config JSON|@FILE] --dtype DTYPE\n"
    "           --rows N --cols N --id ID FILE\n"
    "\n"
    "Publishes the raw row-major payload in FILE (- = standard input) as the\n"
    "output for ID through the publisher, as an encoder would, waits for the\n"
    "write and prints the key and 'written' or 'skipped: REASON'.  FILE must\n"
    "hold exactly ROWS x COLS elements of DTYPE.  An existing object is never\n"
    "replaced.\n";

/* Publishes data (which it owns) as the output for id, as an encoder does
 * (the output must be a candidate of the step), waits for the write and
 * says what became of it. */
static int publish_one(encache *ec, const char *id, int dtype, uint64_t rows,
                       uint64_t cols, char *data, size_t len) {
  encache_candidate cand = {sizeof(cand), id, ENCACHE_MODALITY_IMAGE, dtype,
                            rows, cols, ENCACHE_DEVICE_HOST, 0};
  encache_result res;
  encache_step *step = NULL;
  int rc = engine_lookup(ec, &step, &cand, 1, &res, &host_allocator);
  if (rc > 0)
    free(res.data);
  char key[4096];
  encache_key(encache_namespace_of(ec), id, key, sizeof(key));
  encache_storage *s = NULL;
  if (rc >= 0)
    rc = encache_storage_new(data, len, free_data, data, &s);
  else
    free(data);
  if (rc >= 0) {
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    encache_tensor v = {sizeof v, data, dtype, 2, shape, NULL, 0, 0, NULL};
    rc = engine_publish(step, id, &v, s);
    encache_storage_unref(s);
  }
  encache_step_close(step);
  if (rc > 0) { /* a skip reason; ENCACHE_QUEUED is 0 */
    printf("%s skipped: %s\n", key, encache_skip_name(rc));
    return EXIT_OK;
  }
  encache_stats before, after;
  engine_stats(ec, &before);
  if (rc == ENCACHE_QUEUED)
    rc = encache_flush(ec);
  engine_stats(ec, &after);
  if (rc < 0) {
    fprintf(stderr, "encache publish: %s\n", encache_errmsg(ec));
    return EXIT_FAIL;
  }
  if (after.published_written > before.published_written)
    printf("%s written\n", key);
  else if (after.published_present > before.published_present)
    printf("%s skipped: already in the Store (never replaced)\n", key);
  else {
    const char *why = engine_last_log();
    const char *cut = strstr(why, " not written: ");
    printf("%s not written: the Store failed (recoverable): %s\n", key,
           cut ? cut + 14 : why[0] ? why : "no reason given");
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

static int run_publish(const tool_globals *g, const tool_args *a) {
  ns_opts o;
  uint64_t rows, cols, nbytes;
  const char *id = a->val[E_ID], *file = a->argv[0];
  if (engine_args("publish", a, &o, &rows, &cols) < 0)
    return EXIT_USAGE;
  if (id == NULL || id[0] == '\0')
    return usage_error("publish", "--id is required");
  if (encache_payload_size(o.dtype, rows, cols, &nbytes) < 0)
    return usage_error("publish", "%" PRIu64 "x%" PRIu64 " is too large", rows,
                       cols);
  size_t len;
  char *data = nbytes < SIZE_MAX ? read_file_max(file, (size_t)nbytes, &len)
                                  : NULL;
  if (data == NULL)
    return EXIT_USAGE;
  if ((uint64_t)len != nbytes) {
    free(data);
    return usage_error("publish",
                       "%s holds %s%zu bytes, but %" PRIu64 "x%" PRIu64 " %s "
                       "needs %" PRIu64, file, len > nbytes ? "more than " : "",
                       len > nbytes ? len - 1 : len, rows, cols,
                       encache_dtype_name(o.dtype), nbytes);
  }
  int exit_code;
  encache *ec = open_engine("publish", g, &o, 0, &exit_code);
  if (ec == NULL) {
    free(data);
    return exit_code;
  }
  exit_code = publish_one(ec, id, o.dtype, rows, cols, data, len);
  return close_engine("publish", ec, exit_code);
}

const tool_command cmd_lookup = {
    "lookup", "look identifiers up as an encoder would", lookup_usage,
    lookup_opts, TOOL_STORE | TOOL_JSON, 1, -1, "at least one ID",
    run_lookup};

const tool_command cmd_publish = {
    "publish", "publish a payload as an encoder's output", publish_usage,
    publish_opts, TOOL_STORE, 1, 1, "one FILE", run_publish};
