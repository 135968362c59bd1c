/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tool.h: what the subcommands of the encache tool share.  The tool uses
 * the public header only, like any other program would.
 *
 * Every command is one tool_command: its name, summary, usage text, its
 * own options and its handler.  main.c holds the table of them, parses
 * the options shared by all commands (--help, --store, --json) and each
 * command's own through one function (tool_parse), and calls the handler
 * with the values found.
 *
 * Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad input
 * (a configuration that is refused, a file that cannot be read).
 */
#ifndef ENCACHE_TOOL_H
#define ENCACHE_TOOL_H

#include <stddef.h>

#include "encache.h"

#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE 2

#define TOOL_MAX_STORES 8
#define TOOL_MAX_OPTS 24

typedef struct tool_globals {
  const char *store_url; /* --store or ENCACHE_STORE; NULL = the default */
  const char *stores[TOOL_MAX_STORES]; /* every --store given (bench) */
  int nstores;
  int json; /* --json (commands with TOOL_JSON) */
} tool_globals;

/* One option of a command (without the leading "--"); its index in the
 * command's table is where its value lands in tool_args.val. */
typedef struct tool_opt {
  const char *name;
  int has_value; /* 1: takes a value, 0: a flag */
} tool_opt;

/* What tool_parse found: each own option's value by its index (NULL when
 * not given; "" for a flag given), and the positional arguments. */
typedef struct tool_args {
  const char *val[TOOL_MAX_OPTS];
  int argc;
  char **argv;
  encache_store *st; /* TOOL_OPEN: the Store, opened (and closed) by main */
} tool_args;

enum {
  TOOL_STORE = 1,  /* takes --store after the command name too */
  TOOL_STORES = 2, /* --store may be given several times */
  TOOL_JSON = 4,   /* takes --json */
  TOOL_OPEN = 8,   /* runs on the Store, which main opens and closes */
  TOOL_EXISTING = 16, /* never creates a Store: an shm segment must exist */
};

/* The Store URL of g (the default when none was given) in buf, with
 * create=no added to an shm:// URL, or to the local part of a tier: URL,
 * that does not say (a read-only command answers "no such segment"
 * instead of creating one). */
const char *tool_existing_url(const tool_globals *g, char *buf, size_t size);

/* Opens the Store of g for cmd (an existing one only, when existing is
 * set: tool_existing_url()); prints why and returns NULL on failure.
 * Commands with TOOL_OPEN get theirs from main; others call this after
 * checking their arguments. */
encache_store *tool_open_store(const char *cmd, const tool_globals *g,
                               int existing);

typedef struct tool_command {
  const char *name, *summary, *usage;
  const tool_opt *opts; /* the command's own, ended by {NULL, 0}; or NULL */
  int flags;            /* TOOL_STORE, TOOL_STORES, TOOL_JSON, TOOL_OPEN */
  int min_args, max_args; /* positional arguments (max -1: any number) */
  const char *args;       /* their synopsis, for "expects ARGS" */
  int (*run)(const tool_globals *g, const tool_args *a);
} tool_command;

extern const tool_command cmd_key, cmd_config, cmd_put, cmd_get, cmd_inspect,
    cmd_ls, cmd_stats, cmd_rm, cmd_purge, cmd_shm, cmd_lookup, cmd_publish,
    cmd_demo, cmd_bench, cmd_identity;
extern const tool_command cmd_exporter, cmd_top; /* added in 1.3 */
extern const tool_command cmd_namespaces;        /* added in 1.3 */

/* Parses argv (argv[0] is the command's name) for cmd: the shared options
 * into g, the command's own into a.  Returns -1 to go on, EXIT_OK when
 * --help was printed, or EXIT_USAGE after a message naming the option or
 * argument at fault. */
int tool_parse(const tool_command *cmd, int argc, char **argv, tool_globals *g,
               tool_args *a);

/* Prints "encache CMD: " + message to stderr; returns EXIT_USAGE so that
 * callers can `return usage_error(...)`. */
int usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reads a whole file ("-" = standard input) into a NUL-terminated buffer
 * the caller frees.  On failure prints why and returns NULL. */
char *read_file(const char *path, size_t *len);
/* The same, reading at most max + 1 bytes (a longer file is reported as
 * max + 1 bytes): a file that cannot be what is expected (/dev/zero) is
 * never read whole. */
char *read_file_max(const char *path, size_t max, size_t *len);

/* The argument itself, or the contents of FILE when it is "@FILE".  The
 * caller frees the result.  On failure prints why and returns NULL. */
char *arg_or_file(const char *arg, size_t *len);

/* Parses the decimal integer value of option opt into *out; it must lie
 * in [lo, hi].  Otherwise prints an error naming opt and returns -1. */
int tool_int(const char *cmd, const char *opt, const char *text, long long lo,
             long long hi, long long *out);

/* The same for an int. */
int tool_int32(const char *cmd, const char *opt, const char *text, int lo,
               int hi, int *out);

/* The namespace options shared by key, lookup and publish: the first
 * NS_COUNT_ entries of their option tables are TOOL_NS_OPTS. */
enum {
  NS_MODEL,
  NS_PREFIX,
  NS_CONFIG,
  NS_REVISION,
  NS_ENCODER_HASH,
  NS_TP_MODE,
  NS_ATTN_BACKEND,
  NS_ATTN_DTYPE,
  NS_FP8_SCALE_PATH,
  NS_MM_FACTORS,
  NS_DTYPE,
  NS_COUNT_
};

#define TOOL_NS_OPTS                                                         \
  {"model", 1}, {"prefix", 1}, {"config", 1}, {"revision", 1},               \
      {"encoder-hash", 1}, {"vllm-mm-encoder-tp-mode", 1},                   \
      {"vllm-mm-encoder-attn-backend", 1},                                   \
      {"vllm-mm-encoder-attn-dtype", 1},                                     \
      {"vllm-mm-encoder-fp8-scale-path", 1}, {"vllm-mm-factors", 1},         \
      {"dtype", 1}

typedef struct ns_opts {
  const char *model, *prefix, *revision, *encoder_hash, *config;
  int dtype;
  char hash[40]; /* the encoder field computed from --vllm-mm-encoder-* */
} ns_opts;

/* Reads and checks the namespace options of a into o (the dtype is
 * required; the encoder field from --vllm-mm-encoder-* is computed).
 * Prints why and returns -1 on bad input. */
int ns_from_args(const char *cmd, const tool_args *a, ns_opts *o);

/* The vLLM ec-transfer-config of o: --config's JSON, or one with
 * cross_encoder_cache on and --prefix, in *json (which the caller frees)
 * and loaded into the configuration returned (which the caller frees with
 * encache_config_free), its warnings printed.  Prints why and returns
 * NULL on failure. */
encache_config *ns_config(const char *cmd, const ns_opts *o, char **json,
                          size_t *len);

/* The namespace of o (as `encache key --namespace` prints it), from
 * malloc.  Prints why and returns NULL on failure, with *exit_code
 * EXIT_USAGE (bad options or configuration) or EXIT_FAIL (memory). */
char *ns_string(const char *cmd, const ns_opts *o, int *exit_code);

/* config check's namespace part (cmd_config_ns.c): prints the namespace
 * of a's namespace options with the ec-transfer-config ec_arg and, when
 * g names a Store, how many objects it holds there, warning when none
 * while namespaces of the same model have some.  Returns an exit code. */
int config_check_namespace(const tool_globals *g, const tool_args *a,
                           const char *ec_arg);

/* Opens an engine handle for the namespace options on the global Store
 * (an existing one only when existing is set: tool_existing_url()).
 * Prints why and returns NULL on failure, with *exit_code EXIT_USAGE (bad
 * options or configuration) or EXIT_FAIL (the Store cannot be opened). */
encache *open_engine(const char *cmd, const tool_globals *g, const ns_opts *o,
                     int existing, int *exit_code);
/* The latest message the engine of open_engine() logged ("" if none). */
const char *engine_last_log(void);

/* Lookup destinations from malloc (the caller frees each hit's data), and
 * free() as a storage release callback. */
extern const encache_allocator tool_host_allocator;
void tool_free(void *p);

#endif
