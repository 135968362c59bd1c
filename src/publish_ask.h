/* SPDX-License-Identifier: Apache-2.0 */
/*
 * publish_ask.h: asking existence ahead for queued jobs (publish_ask.c),
 * a part of the publisher.
 */
#ifndef ENCACHE_PUBLISH_ASK_H
#define ENCACHE_PUBLISH_ASK_H

#include "publish_job.h"

/* Asks existence ahead for job j (just taken by this writer) and the
 * jobs queued behind it, when the Store's write asks existence first.
 * Called and returns with the publisher's mu held; releases it
 * meanwhile. */
void encache__ask_ahead(encache *ec, encache__job *j);

#endif
