/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_config_ns.h: the namespace part of `encache config check`
 * (cmd_config_ns.c), which cmd_config.c calls.
 */
#ifndef ENCACHE_TOOL_CMD_CONFIG_NS_H
#define ENCACHE_TOOL_CMD_CONFIG_NS_H

#include "tool.h"

/* config check's namespace part (cmd_config_ns.c): prints the namespace
 * of a's namespace options with the ec-transfer-config ec_arg and, when
 * g names a Store, how many objects it holds there, warning when none
 * while namespaces of the same model have some.  Returns an exit code. */
int config_check_namespace(const tool_globals *g, const tool_args *a,
                           const char *ec_arg);

#endif
