/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tool.h: what the commands of the encache tool stand on (tool.c), the
 * bottom of tools/encache/.  The tool uses the public header only, like
 * any other program would.
 *
 * Every command is one tool_command: its name, summary, usage text, its
 * own options and its handler.  main.c holds the table of them
 * (commands.h) and calls a command's handler with the values that
 * tool_parse() found: the options shared by all commands (--help,
 * --store, --json) and the command's own.  ns.h is the floor above: the
 * namespace options of the commands that name a namespace.
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

/* Adds one --store URL to g (a global one or one after the command
 * cmd, NULL for a global one); EXIT_USAGE after a message. */
int tool_add_store(tool_globals *g, const char *cmd, const char *url);

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

/* --timeout SECONDS of the commands that walk a Store's keys (ls,
 * namespaces, purge): the time bound they set on their Store
 * (encache_store_set_list_timeout()), so that a server whose SCAN never
 * ends cannot keep them running for minutes.  TOOL_TIMEOUT_HELP is the
 * line of their usage texts. */
#define TOOL_TIMEOUT_S 60
#define TOOL_TIMEOUT_MAX_S 86400
#define TOOL_TIMEOUT_HELP                                                      \
  "  --timeout SECONDS stop after SECONDS (1 to 86400, default 60), exit 1:\n" \
  "                    a Redis server whose SCAN never ends cannot keep\n"     \
  "                    the command running\n"
/* Parses text (NULL: not given, the default) into *ms; -1 after a usage
 * error naming --timeout. */
int tool_timeout(const char *cmd, const char *text, uint32_t *ms);

#endif
