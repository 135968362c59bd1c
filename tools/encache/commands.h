/* SPDX-License-Identifier: Apache-2.0 */
/*
 * commands.h: the commands of the encache tool, one tool_command each
 * (defined in the cmd_*.c files), which main.c's table lists.  Only
 * main.c and the files that define them include it: a command never
 * calls another through the table.
 */
#ifndef ENCACHE_TOOL_COMMANDS_H
#define ENCACHE_TOOL_COMMANDS_H

#include "tool.h"

extern const tool_command cmd_key, cmd_config, cmd_put, cmd_get, cmd_inspect,
    cmd_ls, cmd_stats, cmd_rm, cmd_purge, cmd_shm, cmd_lookup, cmd_publish,
    cmd_demo, cmd_bench, cmd_identity;
extern const tool_command cmd_exporter, cmd_top; /* added in 1.3 */
extern const tool_command cmd_namespaces;        /* added in 1.3 */

#endif
