/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/sections.h: the rules between the options of a section
 * (sections.c: required options, ec_role with ec_connector, Mooncake's
 * mode against its segment) and the derived local hostname.
 */
#ifndef ENCACHE_CONFIG_SECTIONS_H
#define ENCACHE_CONFIG_SECTIONS_H

#include "config/value.h"

/* The rules between options of section sec, on vals. */
int encache__section_check(encache_config *cfg, const value *vals,
                           enum section sec);
/* Sets the derived local_hostname in vals. */
int encache__derive_hostname(encache_config *cfg, value *vals);

#endif
