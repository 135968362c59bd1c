/*
 * tool.h: what the subcommands of the encache tool share.  The tool uses
 * the public header only, like any other program would.
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

typedef struct tool_globals {
  const char *store_url; /* --store or ENCACHE_STORE; NULL = the default */
  const char *stores[8]; /* every global --store given (bench takes several) */
  int nstores;
} tool_globals;

typedef struct tool_command {
  const char *name;
  const char *summary;
  int (*run)(const tool_globals *g, int argc, char **argv);
} tool_command;

int cmd_key(const tool_globals *g, int argc, char **argv);
int cmd_config(const tool_globals *g, int argc, char **argv);
int cmd_put(const tool_globals *g, int argc, char **argv);
int cmd_get(const tool_globals *g, int argc, char **argv);
int cmd_inspect(const tool_globals *g, int argc, char **argv);
int cmd_ls(const tool_globals *g, int argc, char **argv);
int cmd_stats(const tool_globals *g, int argc, char **argv);
int cmd_rm(const tool_globals *g, int argc, char **argv);
int cmd_shm(const tool_globals *g, int argc, char **argv);

/* Prints "encache: " + message to stderr; returns EXIT_USAGE so that
 * callers can `return usage_error(...)`. */
int usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reads a whole file ("-" = standard input) into a NUL-terminated buffer
 * the caller frees.  On failure prints why and returns NULL. */
char *read_file(const char *path, size_t *len);

/* The argument itself, or the contents of FILE when it is "@FILE".  The
 * caller frees the result.  On failure prints why and returns NULL. */
char *arg_or_file(const char *arg, size_t *len);

/* Parses a strictly positive (or, with allow_zero, non-negative) decimal
 * integer option; prints an error naming `opt` and returns -1 otherwise. */
int parse_int_option(const char *cmd, const char *opt, const char *text,
                     int allow_zero, long long *out);

/* The namespace options shared by key, lookup and publish. */
typedef struct ns_opts {
  const char *model, *prefix, *revision, *encoder_hash, *dtype;
  const char *config; /* --config JSON|@FILE (lookup, publish) */
} ns_opts;

#define NS_LONGOPTS                                                          \
  {"model", required_argument, NULL, 'm'},                                   \
      {"prefix", required_argument, NULL, 'p'},                              \
      {"revision", required_argument, NULL, 'r'},                            \
      {"encoder-hash", required_argument, NULL, 'e'},                        \
      {"dtype", required_argument, NULL, 'd'}

/* Stores option c's argument in o; returns 1 if c is a namespace option. */
int ns_option(ns_opts *o, int c, const char *arg);

/* Opens an engine handle for the namespace options on the global Store:
 * the vLLM JSON of --config (or one with cross_encoder_cache on and the
 * --prefix), the model, revision, encoder hash and dtype.  Prints why
 * and returns NULL on failure. */
struct encache;
struct encache *open_engine(const char *cmd, const tool_globals *g,
                            const ns_opts *o);

/* Lookup destinations from malloc (the caller frees each hit's data), and
 * free() as a storage release callback. */
extern const encache_allocator tool_host_allocator;
void tool_free(void *p);

int cmd_lookup(const tool_globals *g, int argc, char **argv);
int cmd_publish(const tool_globals *g, int argc, char **argv);
int cmd_demo(const tool_globals *g, int argc, char **argv);
int cmd_bench(const tool_globals *g, int argc, char **argv);

#endif
