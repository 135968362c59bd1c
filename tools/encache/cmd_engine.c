/*
 * Commands that drive the engine through the public API, for operators
 * debugging a deployment: lookup and publish.
 */
#include "tool.h"

#include "encache.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ns_option(ns_opts *o, int c, const char *arg) {
  switch (c) {
  case 'm': o->model = arg; return 1;
  case 'p': o->prefix = arg; return 1;
  case 'r': o->revision = arg; return 1;
  case 'e': o->encoder_hash = arg; return 1;
  case 'd': o->dtype = arg; return 1;
  case 'C': o->config = arg; return 1;
  default: return 0;
  }
}

/* --vllm-mm-encoder-tp-mode and --vllm-mm-encoder-attn-backend of lookup
 * and publish: the encoder field computed as vLLM computes it. */
typedef struct vllm_opts {
  const char *tp_mode, *backend;
  char hash[40];
} vllm_opts;

static int vllm_option(vllm_opts *v, int c, const char *arg) {
  if (c == 'T')
    v->tp_mode = arg;
  else if (c == 'A')
    v->backend = arg;
  else
    return 0;
  return 1;
}

/* Sets o->encoder_hash from v; prints why and returns -1 on bad input. */
static int vllm_encoder(const char *cmd, vllm_opts *v, ns_opts *o) {
  if (v->tp_mode == NULL && v->backend == NULL)
    return 0;
  if (o->encoder_hash != NULL)
    return usage_error(cmd, "--encoder-hash and --vllm-mm-encoder-* both set "
                            "the encoder field: give one"), -1;
  if (v->tp_mode == NULL)
    return usage_error(cmd, "--vllm-mm-encoder-attn-backend needs "
                            "--vllm-mm-encoder-tp-mode (vLLM's default is "
                            "\"weights\")"), -1;
  if (encache_vllm_encoder_hash(v->tp_mode, v->backend, v->hash,
                                sizeof(v->hash)) < 0)
    return usage_error(cmd, "--vllm-mm-encoder-tp-mode must be \"weights\" or "
                            "\"data\" and --vllm-mm-encoder-attn-backend a "
                            "backend name (letters, digits, '_')"), -1;
  o->encoder_hash = v->hash;
  return 0;
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

struct encache *open_engine(const char *cmd, const tool_globals *g,
                            const ns_opts *o) {
  if (o->dtype == NULL) {
    usage_error(cmd, "--dtype is required (float32, float16 or bfloat16)");
    return NULL;
  }
  int dtype = encache_dtype_parse(o->dtype);
  if (dtype < 0) {
    usage_error(cmd, "--dtype: unknown dtype \"%s\"", o->dtype);
    return NULL;
  }
  char *json = NULL;
  size_t len = 0;
  if (o->config != NULL) {
    if (o->prefix != NULL) {
      usage_error(cmd, "--prefix and --config both set the prefix: give "
                       "embedding_cache_prefix in --config instead");
      return NULL;
    }
    if ((json = arg_or_file(o->config, &len)) == NULL)
      return NULL;
    /* The engine refuses what is wrong; say what is surprising. */
    encache_config *cfg = NULL;
    if (encache_config_new(&cfg) == 0 &&
        encache_config_load_ec(cfg, json, len) == 0)
      for (int i = 0; i < encache_config_warning_count(cfg); i++)
        fprintf(stderr, "encache %s: warning: %s\n", cmd,
                encache_config_warning_at(cfg, i));
    encache_config_free(cfg);
  } else {
    char prefix[1024];
    json_escape(prefix, sizeof(prefix), o->prefix ? o->prefix : "");
    size_t need = strlen(prefix) + 128;
    json = malloc(need);
    if (json == NULL)
      return NULL;
    snprintf(json, need,
             "{\"ec_connector_extra_config\": {\"cross_encoder_cache\": true, "
             "\"embedding_cache_prefix\": \"%s\"}}", prefix);
    len = strlen(json);
  }
  encache_options opts;
  memset(&opts, 0, sizeof(opts));
  opts.ec_transfer_config = json;
  opts.ec_transfer_config_len = len;
  opts.model = o->model;
  opts.revision = o->revision;
  opts.encoder_hash = o->encoder_hash;
  opts.model_dtype = dtype;
  opts.store_url = g->store_url;
  encache *ec = NULL;
  int rc = encache_open(&opts, &ec);
  free(json);
  if (rc != 0) {
    fprintf(stderr, "encache %s: %s\n", cmd, encache_errmsg(ec));
    encache_close(ec);
    return NULL;
  }
  if (!encache_enabled(ec)) {
    fprintf(stderr, "encache %s: cross_encoder_cache is false in --config: "
                    "nothing would be looked up or published\n", cmd);
    encache_close(ec);
    return NULL;
  }
  return ec;
}

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

const encache_allocator tool_host_allocator = {NULL, host_alloc, host_release};

void tool_free(void *p) { free(p); }

/* Shared parsing of --rows/--cols. */
static int parse_shape(const char *cmd, const char *rows, const char *cols,
                       uint64_t *r, uint64_t *c) {
  long long v;
  if (rows == NULL || cols == NULL)
    return usage_error(cmd, "--rows and --cols are required"), -1;
  if (parse_int_option(cmd, "--rows", rows, 0, &v) < 0)
    return -1;
  *r = (uint64_t)v;
  if (parse_int_option(cmd, "--cols", cols, 0, &v) < 0)
    return -1;
  *c = (uint64_t)v;
  return 0;
}

static const char lookup_usage[] =
    "usage: encache [--store URL] lookup --model M [--prefix P] [--revision R]\n"
    "           [--encoder-hash H | --vllm-mm-encoder-tp-mode MODE\n"
    "            [--vllm-mm-encoder-attn-backend NAME]]\n"
    "           [--config JSON|@FILE] --dtype DTYPE\n"
    "           --rows N --cols N [--json] ID...\n"
    "\n"
    "Looks the identifiers up as an encoder would (one batched existence\n"
    "check, chunked reads, validation against DTYPE ROWSxCOLS) and prints one\n"
    "line per identifier: 'ID HIT DTYPE ROWS COLS', or ID and why it is not a\n"
    "hit: MISS, INCOMPATIBLE (and what did not match), OVERSIZE, UNAVAILABLE,\n"
    "SKIPPED.  --config takes the vLLM ec-transfer-config (its prefix, model\n"
    "identity and limits) in place of --prefix.  Exit 0 when it ran.\n";

static void describe_incompat(char *buf, size_t size, const encache_result *r,
                              const encache_candidate *c) {
  switch (r->verdict) {
  case ENCACHE_BAD_SHAPE:
    snprintf(buf, size, "shape %" PRIu64 "x%" PRIu64 " (expected %" PRIu64
                        "x%" PRIu64 ")", r->found.rows, r->found.cols, c->rows,
             c->cols);
    break;
  case ENCACHE_BAD_DTYPE: {
    const char *n = encache_dtype_name((int)r->found.dtype);
    snprintf(buf, size, "dtype %s (expected %s)", n ? n : "unknown",
             encache_dtype_name(c->dtype));
    break;
  }
  case ENCACHE_BAD_MAGIC:
    snprintf(buf, size, "magic 0x%08" PRIx32 " (expected 0x%08x)",
             r->found.magic, ENCACHE_MAGIC);
    break;
  default:
    snprintf(buf, size, "length (not 24 + %" PRIu64 " bytes)",
             c->rows * c->cols * encache_dtype_size(c->dtype));
    break;
  }
}

int cmd_lookup(const tool_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      NS_LONGOPTS,
      {"config", required_argument, NULL, 'C'},
      {"vllm-mm-encoder-tp-mode", required_argument, NULL, 'T'},
      {"vllm-mm-encoder-attn-backend", required_argument, NULL, 'A'},
      {"rows", required_argument, NULL, 'R'},
      {"cols", required_argument, NULL, 'K'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  ns_opts o = {0};
  vllm_opts vo = {NULL, NULL, ""};
  const char *rows_s = NULL, *cols_s = NULL;
  int json = 0, c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (ns_option(&o, c, optarg) || vllm_option(&vo, c, optarg))
      continue;
    switch (c) {
    case 'R': rows_s = optarg; break;
    case 'K': cols_s = optarg; break;
    case 'j': json = 1; break;
    case 'h': fputs(lookup_usage, stdout); return EXIT_OK;
    case ':': return usage_error("lookup", "%s needs a value", argv[optind - 1]);
    default:
      return usage_error("lookup", "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  uint64_t rows, cols;
  if (parse_shape("lookup", rows_s, cols_s, &rows, &cols) < 0)
    return EXIT_USAGE;
  size_t n = (size_t)(argc - optind);
  if (n == 0)
    return usage_error("lookup", "expects at least one ID (see --help)");
  if (vllm_encoder("lookup", &vo, &o) < 0)
    return EXIT_USAGE;
  encache *ec = open_engine("lookup", g, &o);
  if (ec == NULL)
    return EXIT_USAGE;
  int dtype = encache_dtype_parse(o.dtype);
  encache_candidate *cands = calloc(n, sizeof(*cands));
  encache_result *res = calloc(n, sizeof(*res));
  if (cands == NULL || res == NULL) {
    fprintf(stderr, "encache lookup: out of memory\n");
    free(cands);
    free(res);
    encache_close(ec);
    return EXIT_FAIL;
  }
  for (size_t i = 0; i < n; i++) {
    encache_candidate cc = {argv[optind + (int)i], ENCACHE_MODALITY_IMAGE,
                            dtype, rows, cols, ENCACHE_DEVICE_HOST, 0};
    cands[i] = cc;
  }
  encache_allocator a = tool_host_allocator;
  int rc = encache_lookup(ec, cands, n, &a, res);
  int exit_code = EXIT_OK;
  if (rc < 0) {
    fprintf(stderr, "encache lookup: %s\n", encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  } else {
    if (json)
      printf("[");
    for (size_t i = 0; i < n; i++) {
      char why[160] = "", id[1024];
      if (res[i].outcome == ENCACHE_INCOMPATIBLE)
        describe_incompat(why, sizeof(why), &res[i], &cands[i]);
      if (json) {
        json_escape(id, sizeof(id), cands[i].id);
        printf("%s\n {\"id\": \"%s\", \"outcome\": \"%s\"", i ? "," : "", id,
               encache_outcome_name(res[i].outcome));
        if (res[i].outcome == ENCACHE_HIT)
          printf(", \"dtype\": \"%s\", \"rows\": %" PRIu64 ", \"cols\": %" PRIu64
                 ", \"bytes\": %" PRIu64, encache_dtype_name(dtype), rows, cols,
                 res[i].nbytes);
        if (why[0])
          printf(", \"mismatch\": \"%s\", \"verdict\": \"%s\"", why,
                 encache_verdict_name(res[i].verdict));
        printf("}");
      } else if (res[i].outcome == ENCACHE_HIT) {
        printf("%s HIT %s %" PRIu64 " %" PRIu64 "\n", cands[i].id,
               encache_dtype_name(dtype), rows, cols);
      } else {
        printf("%s %s%s%s\n", cands[i].id, encache_outcome_name(res[i].outcome),
               why[0] ? " " : "", why);
      }
      free(res[i].data);
    }
    if (json)
      printf("\n]\n");
  }
  free(cands);
  free(res);
  if (encache_close(ec) < 0 && exit_code == EXIT_OK) {
    fprintf(stderr, "encache lookup: %s\n", encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  }
  return exit_code;
}

static const char publish_usage[] =
    "usage: encache [--store URL] publish --model M [--prefix P] [--revision R]\n"
    "           [--encoder-hash H | --vllm-mm-encoder-tp-mode MODE\n"
    "            [--vllm-mm-encoder-attn-backend NAME]]\n"
    "           [--config JSON|@FILE] --dtype DTYPE\n"
    "           --rows N --cols N --id ID FILE\n"
    "\n"
    "Publishes the raw row-major payload in FILE (- = standard input) as the\n"
    "output for ID through the publisher, as an encoder would, waits for the\n"
    "write and prints the key and 'written' or 'skipped: REASON'.  FILE must\n"
    "hold exactly ROWS x COLS elements of DTYPE.  An existing object is never\n"
    "replaced.\n";

int cmd_publish(const tool_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      NS_LONGOPTS,
      {"config", required_argument, NULL, 'C'},
      {"vllm-mm-encoder-tp-mode", required_argument, NULL, 'T'},
      {"vllm-mm-encoder-attn-backend", required_argument, NULL, 'A'},
      {"rows", required_argument, NULL, 'R'},
      {"cols", required_argument, NULL, 'K'},
      {"id", required_argument, NULL, 'i'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  ns_opts o = {0};
  vllm_opts vo = {NULL, NULL, ""};
  const char *rows_s = NULL, *cols_s = NULL, *id = NULL;
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (ns_option(&o, c, optarg) || vllm_option(&vo, c, optarg))
      continue;
    switch (c) {
    case 'R': rows_s = optarg; break;
    case 'K': cols_s = optarg; break;
    case 'i': id = optarg; break;
    case 'h': fputs(publish_usage, stdout); return EXIT_OK;
    case ':': return usage_error("publish", "%s needs a value", argv[optind - 1]);
    default:
      return usage_error("publish", "unknown option '%s' (see --help)",
                         argv[optind - 1]);
    }
  }
  uint64_t rows, cols, nbytes;
  if (parse_shape("publish", rows_s, cols_s, &rows, &cols) < 0)
    return EXIT_USAGE;
  if (id == NULL || id[0] == '\0')
    return usage_error("publish", "--id is required");
  if (argc - optind != 1)
    return usage_error("publish", "expects one FILE (see --help)");
  int dtype = o.dtype ? encache_dtype_parse(o.dtype) : -1;
  if (dtype >= 0 && encache_payload_size(dtype, rows, cols, &nbytes) < 0)
    return usage_error("publish", "%" PRIu64 "x%" PRIu64 " is too large", rows,
                       cols);
  size_t len;
  char *data = read_file(argv[optind], &len);
  if (data == NULL)
    return EXIT_USAGE;
  if (dtype >= 0 && (uint64_t)len != nbytes) {
    free(data);
    return usage_error("publish",
                       "%s holds %zu bytes, but %" PRIu64 "x%" PRIu64 " %s "
                       "needs %" PRIu64, argv[optind], len, rows, cols,
                       encache_dtype_name(dtype), nbytes);
  }
  if (vllm_encoder("publish", &vo, &o) < 0)
    return EXIT_USAGE;
  encache *ec = open_engine("publish", g, &o);
  if (ec == NULL) {
    free(data);
    return EXIT_USAGE;
  }
  /* As an encoder does: the output must be a candidate of this step. */
  encache_candidate cand = {id, ENCACHE_MODALITY_IMAGE, dtype, rows, cols,
                            ENCACHE_DEVICE_HOST, 0};
  encache_result res;
  encache_allocator a = tool_host_allocator;
  int rc = encache_lookup(ec, &cand, 1, &a, &res);
  free(res.data);
  char key[4096];
  encache_key(encache_namespace_of(ec), id, key, sizeof(key));
  int exit_code = EXIT_OK;
  encache_storage *s = NULL;
  if (rc >= 0)
    rc = encache_storage_new(data, len, tool_free, data, &s);
  else
    free(data);
  if (rc >= 0) {
    int64_t shape[2] = {(int64_t)rows, (int64_t)cols};
    encache_tensor v = {data, dtype, 2, shape, NULL};
    rc = encache_publish(ec, id, &v, s);
    encache_storage_unref(s);
  }
  encache_stats before, after;
  encache_stats_get(ec, &before);
  if (rc == ENCACHE_QUEUED)
    rc = encache_flush(ec);
  else if (rc > 0) {
    printf("%s skipped: %s\n", key, encache_skip_name(rc));
    rc = 0;
    goto out;
  }
  encache_stats_get(ec, &after);
  if (rc < 0) {
    fprintf(stderr, "encache publish: %s\n", encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  } else if (after.published_written > before.published_written) {
    printf("%s written\n", key);
  } else if (after.published_present > before.published_present) {
    printf("%s skipped: already in the Store (never replaced)\n", key);
  } else {
    printf("%s skipped: the Store failed (recoverable)\n", key);
  }
out:
  if (encache_close(ec) < 0 && exit_code == EXIT_OK) {
    fprintf(stderr, "encache publish: %s\n", encache_errmsg(ec));
    exit_code = EXIT_FAIL;
  }
  return exit_code;
}
