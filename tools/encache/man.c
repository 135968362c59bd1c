/* SPDX-License-Identifier: Apache-2.0 */
/*
 * man.c: encache(1) in roff, from the texts that --help prints (man.h).
 *
 * The page has NAME, SYNOPSIS (the usage line of `encache --help`),
 * DESCRIPTION (the rest of `encache --help`), COMMANDS (each command's
 * summary and its whole `--help` text, in the order of the table),
 * ENVIRONMENT and SEE ALSO (the exit status is in --help's text).  The help texts are laid out by hand for an
 * 80-column terminal, so they go in verbatim (no filling),
 * with the characters roff treats specially escaped: a backslash, a dot or
 * quote starting a line, and '-' (written \- so that options render, and
 * copy, as ASCII hyphen-minus).
 */
#include "man.h"

#include "encache.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes len bytes of s with roff's escape character and '-' escaped. */
static void put_text(FILE *out, const char *s, size_t len) {
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '\\')
      fputs("\\e", out);
    else if (s[i] == '-')
      fputs("\\-", out);
    else
      fputc(s[i], out);
  }
}

/* Writes len bytes of s as one roff text line (never read as a request). */
static void put_line(FILE *out, const char *s, size_t len) {
  if (len > 0 && (s[0] == '.' || s[0] == '\''))
    fputs("\\&", out);
  put_text(out, s, len);
  fputc('\n', out);
}

/* Writes text, as --help prints it, line by line, unfilled. */
static void put_lines(FILE *out, const char *text) {
  fputs(".nf\n", out);
  while (*text != '\0') {
    const char *nl = strchr(text, '\n');
    size_t len = nl != NULL ? (size_t)(nl - text) : strlen(text);
    put_line(out, text, len);
    text += len + (nl != NULL);
  }
  fputs(".fi\n", out);
}

/* What help writes, in a string to free; NULL when out of memory. */
static char *help_text(void (*help)(FILE *)) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL)
    return NULL;
  help(f);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* The synopsis (help's first line without "usage: "), then DESCRIPTION
 * with the rest of help's text. */
static void put_overview(FILE *out, const char *text) {
  static const char usage[] = "usage: ";
  fputs(".SH SYNOPSIS\n.nf\n", out);
  if (strncmp(text, usage, sizeof(usage) - 1) == 0) {
    const char *line = text + sizeof(usage) - 1, *nl = strchr(line, '\n');
    size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
    put_line(out, line, len);
    text = line + len;
  } else {
    fputs("encache COMMAND [OPTIONS]\n", out);
  }
  fputs("encache \\-\\-help | \\-\\-version\n.fi\n", out);
  while (*text == '\n')
    text++;
  fputs(".SH DESCRIPTION\n", out);
  put_lines(out, text);
}

/* One command: its summary as a sentence, then its --help text, indented
 * by 4 ens (the usual 7 would push its longest lines, 76 columns, past
 * 80). */
static void put_command(FILE *out, const tool_command *cmd) {
  fprintf(out, ".SS %s\n.PP\n.in 4n\n", cmd->name);
  if (cmd->summary[0] != '\0') {
    /* "\&" first: the text line never reads as a request. */
    fprintf(out, "\\&%c", toupper((unsigned char)cmd->summary[0]));
    put_text(out, cmd->summary + 1, strlen(cmd->summary + 1));
    fputs(".\n.sp\n", out);
  }
  put_lines(out, cmd->usage);
  fputs(".in\n", out);
}

static const char man_trailer[] =
    ".SH ENVIRONMENT\n"
    ".TP\n.B ENCACHE_STORE\n"
    "The Store to use when no \\-\\-store is given (an empty value is "
    "taken as unset).\n"
    ".TP\n.B ENCACHE_REDIS_PASSWORD\n"
    "The password of a Redis Store whose URL and password_file give none.\n"
    "Passwords never appear in what the tool prints.\n"
    ".SH \"SEE ALSO\"\n"
    "The documentation in the source distribution: docs/tool.md (every\n"
    "command), docs/stores.md (Store URLs and their options),\n"
    "docs/library.md (the C library).\n";

int tool_man(FILE *out, void (*help)(FILE *), const tool_command *const *cmds,
             size_t n) {
  char *text = help_text(help);
  if (text == NULL) {
    fprintf(stderr, "encache --man: out of memory\n");
    return EXIT_FAIL;
  }
  fprintf(out, ".TH ENCACHE 1 \"\" \"encache %s\" \"User Commands\"\n",
          encache_version());
  fputs(".nh\n.SH NAME\nencache \\- reuse multimodal encoder outputs through a "
        "shared Store\n",
        out);
  put_overview(out, text);
  free(text);
  fputs(".SH COMMANDS\n", out);
  for (size_t i = 0; i < n; i++)
    put_command(out, cmds[i]);
  fputs(man_trailer, out);
  if (fflush(out) != 0 || ferror(out)) {
    fprintf(stderr, "encache --man: cannot write the page: %s\n",
            strerror(errno));
    return EXIT_FAIL;
  }
  return EXIT_OK;
}
