/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backends.h: how the front (front.c, the scheme table) opens each
 * built-in Store, and all it knows of them.  Each opens from its URL and,
 * on failure, may still return a handle in *out whose errmsg says why
 * (the caller closes it).  A backend's other headers stay in its folder.
 */
#ifndef ENCACHE_STORE_BACKENDS_H
#define ENCACHE_STORE_BACKENDS_H

#include "encache.h"

/* shm://NAME?... (src/store/shm/open.c). */
int encache__shm_open(const char *url, encache_store **out);
/* redis://, redis-cluster:// and unix:// URLs (src/store/redis/ops.c). */
int encache__redis_open(const char *url, encache_store **out);
/* mooncake: and mooncake:PATH URLs (src/store/mooncake.c). */
int encache__mooncake_open(const char *url, encache_store **out);
/* tier:LOCAL+REMOTE (src/store/tier_open.c). */
int encache__tier_open(const char *url, encache_store **out);

#endif
