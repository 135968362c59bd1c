/* SPDX-License-Identifier: Apache-2.0 */
/*
 * buffer.h: the memory of hits (blocks: buffer.c says how they are laid
 * out and cached), the Buffer type NumPy reads them through, and the
 * snapshots of host publications.  It needs neither a handle nor a step.
 */
#ifndef ENCACHE_PY_BUFFER_H
#define ENCACHE_PY_BUFFER_H

#include "core.h"

/* What hits come back as (a handle's output). */
enum { OUT_BUFFER = 0, OUT_NUMPY = 1, OUT_TORCH = 2 };

/* Readies Buffer and adds it to module m; 0 or -1 raised. */
int ec_buffer_register(PyObject *m);

/* The allocator of host hits (encache_allocator's alloc and release): no
 * GIL needed, so the library's lookup thread may run it. */
int ec_block_alloc(void *ctx, size_t i, const encache_candidate *c,
                   uint64_t nbytes, void **data, void **blk);
void ec_block_release(void *ctx, size_t i, void *data, void *blk);
/* Registers the block cache's fork handlers; 0 or an errno. */
int ec_block_cache_init(void);
/* Sets the most bytes of freed blocks kept for reuse; the old value. */
size_t ec_block_cache_set(size_t max_bytes);
/* A copy of src[0..nbytes) in a block (from the cache when one fits) and
 * the storage that owns it, one reference in *out (its release returns
 * the block, on any thread); the copy's address in *copy.  Call with the
 * GIL held (the caller's other threads must not change src meanwhile).
 * 0, or ENCACHE_ENOMEM. */
int ec_snapshot(const void *src, uint64_t nbytes, encache_storage **out,
                const void **copy);
/* The Python object (tensor, array or Buffer) that takes ownership of
 * block blk holding a rows x cols matrix of dtype; output is OUT_*; NULL
 * with an exception set (blk is then freed). */
PyObject *ec_block_wrap(void *blk, int output, int dtype, uint64_t rows,
                        uint64_t cols);

#endif
