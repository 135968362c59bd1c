/* SPDX-License-Identifier: Apache-2.0 */
/*
 * man.h: the manual page of the encache tool, encache(1), written in roff
 * from what `encache --help` and each `encache COMMAND --help` print (the
 * table of commands in main.c), so that the two never disagree.  The build
 * runs the hidden `encache --man` to make encache.1.
 */
#ifndef ENCACHE_TOOL_MAN_H
#define ENCACHE_TOOL_MAN_H

#include <stddef.h>
#include <stdio.h>

#include "tool.h"

/* Writes the page to out: help writes the text of `encache --help`, cmds
 * are the n commands in their --help order.  Returns EXIT_OK, or EXIT_FAIL
 * after a message when out of memory or when out cannot be written. */
int tool_man(FILE *out, void (*help)(FILE *), const tool_command *const *cmds,
             size_t n);

#endif
