/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encache.h: the one public header of libencache.
 *
 * encache lets the encoders of a multimodal serving fleet reuse each
 * other's outputs through a shared Store.  This header is the whole API:
 * anything not declared here is private and may change at any time.
 *
 * Thread safety (applies to every function unless its comment says
 * otherwise):
 *   - Functions without a handle argument (keys, object codec, error
 *     names, version) are pure and may be called from any thread at any
 *     time.
 *   - A handle (encache_config, ...) may be used by one thread at a time;
 *     distinct handles are independent.  Read-only accessors on a handle
 *     that nobody modifies may run concurrently.
 *
 * Conventions:
 *   - Functions return int: 0 (or a count) on success, a negative
 *     ENCACHE_E* code on failure.  System errors are -errno.
 *   - Every `const char *` argument may be freed by the caller as soon as
 *     the call returns; the library copies what it keeps.
 *   - Strings returned by the library are owned by it; their lifetime is
 *     given at each function.
 *   - `*_free(NULL)` is a no-op.
 *   - Errors: each handle keeps the message of its last failure
 *     (encache_errmsg(), encache_store_errmsg(), encache_config_errmsg());
 *     a failed open returns no handle, and its reason is the calling
 *     thread's encache_errmsg(NULL) / encache_store_errmsg(NULL).
 *     Messages live in fixed buffers: out of memory never empties one.
 *
 * Versioning: same major version = same ABI.  Every struct the caller
 * allocates starts with `size_t size`, which the caller sets to sizeof()
 * of the struct it was compiled with (the ENCACHE_*_INIT initialisers do
 * it); the library reads and writes only that many bytes, refuses a size
 * below API 1.0's or above 4096 (a size nobody set), and refuses a larger
 * struct whose fields unknown to it are not zero.  Arrays of such structs
 * are strided by the first element's size.  encache_header and
 * encache_contract carry no size: they are the fields of the v3 wire
 * header, which never grows (a new format would get structs of its own).
 * tests/abi/1.0/encache.h is this header as 1.0 froze it; the tests run a
 * program built against it on every later library.
 */
#ifndef ENCACHE_H
#define ENCACHE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ENCACHE_BUILDING) && defined(__GNUC__)
#define ENCACHE_EXTERN __attribute__((visibility("default")))
#else
#define ENCACHE_EXTERN
#endif

/* ---------------------------------------------------------------- version */

#define ENCACHE_VERSION_MAJOR 1
#define ENCACHE_VERSION_MINOR 3
#define ENCACHE_VERSION_PATCH 0
#define ENCACHE_VERSION_HEX                                                  \
  ((ENCACHE_VERSION_MAJOR << 16) | (ENCACHE_VERSION_MINOR << 8) |            \
   (ENCACHE_VERSION_PATCH))
#define ENCACHE_VERSION_STRING "1.3.0"

/* The version of the library actually loaded, as "MAJOR.MINOR.PATCH".
 * Static storage; never free it. */
ENCACHE_EXTERN const char *encache_version(void);
/* The same as ENCACHE_VERSION_HEX of the loaded library. */
ENCACHE_EXTERN unsigned encache_version_number(void);

/* ----------------------------------------------------------------- errors */

/*
 * Every error code, once: XX(NAME, value, message).  System errors keep
 * their errno value (negated); library errors live in the reserved range
 * -30600 .. -30699, far from any errno.  ENCACHE_EBUDGET is never
 * returned (a publication over its budget is skipped:
 * ENCACHE_SKIP_OVER_ITEMS, ENCACHE_SKIP_OVER_BYTES); it stays so that its
 * value is never given to another error (ABI).
 */
#define ENCACHE_ERRNO_MAP(XX)                                                \
  XX(EINVAL, -EINVAL, "invalid argument")                                    \
  XX(ENOMEM, -ENOMEM, "out of memory")                                       \
  XX(ENOBUFS, -ENOBUFS, "buffer too small")                                  \
  XX(ENOENT, -ENOENT, "no such object")                                      \
  XX(EEXIST, -EEXIST, "object already exists")                               \
  XX(EIO, -EIO, "input/output error")                                        \
  XX(ECONFIG, -30600, "invalid configuration")                               \
  XX(EJSON, -30601, "malformed JSON")                                        \
  XX(EDTYPE, -30602, "unsupported dtype")                                    \
  XX(ESHAPE, -30603, "not a 2-D matrix")                                     \
  XX(ECONTIG, -30604, "matrix is not contiguous")                            \
  XX(EINCOMPAT, -30605, "object incompatible with the expected contract")    \
  XX(ETOOLARGE, -30606, "object too large")                                  \
  XX(EUNAVAIL, -30607, "store unavailable (recoverable)")                    \
  XX(EUNCONFIRMED, -30608, "store operation completion unconfirmed")         \
  XX(EPOISONED, -30609, "handle poisoned by an unconfirmed store operation") \
  XX(ECLOSED, -30610, "handle is closed")                                    \
  XX(EBUDGET, -30611, "publication budget exhausted")                        \
  XX(EFORMAT, -30612, "incompatible or corrupted store format")              \
  XX(EURL, -30613, "invalid store URL")                                      \
  XX(ENOLIB, -30614, "a library the Store needs cannot be loaded")          \
  XX(ESTEPS, -30615, "too many steps open on the handle (close one first)")  \
  XX(EPENDING, -30616, "the step's lookup is not complete yet")

typedef enum encache_errno {
#define ENCACHE_ERR_ENUM_(name, value, msg) ENCACHE_##name = (value),
  ENCACHE_ERRNO_MAP(ENCACHE_ERR_ENUM_)
#undef ENCACHE_ERR_ENUM_
  ENCACHE_ERRNO_MAX_ = -30699
} encache_errno;

/* A human-readable message for any code returned by this library
 * (including -errno values).  Static storage; never NULL. */
ENCACHE_EXTERN const char *encache_strerror(int err);
/* The code's name without prefix, e.g. "EINVAL", "EPOISONED"; "UNKNOWN"
 * for codes not in the table.  Static storage; never NULL. */
ENCACHE_EXTERN const char *encache_err_name(int err);

/* ------------------------------------------------------------- allocator */

/*
 * The allocator of every block libencache allocates, as hiredis's
 * hiredisSetAllocators() allows.  Members left NULL are the C library's;
 * malloc_fn, calloc_fn, realloc_fn and free_fn are given all four or none
 * (ENCACHE_EINVAL otherwise).  Blocks from aligned_alloc_fn are released
 * with free_fn; with aligned_alloc_fn NULL and malloc_fn set, aligned
 * blocks are carved from larger malloc_fn blocks.  The libraries encache
 * uses keep their own hooks (hiredisSetAllocators, json_set_alloc_funcs).
 *
 * Not thread safe: set it at start-up, before any handle exists, and never
 * change it while one is open.  fns NULL restores the C library's.  *old,
 * when not NULL, receives the previous allocator (old->size set by the
 * caller).
 */
typedef struct encache_allocfuncs {
  size_t size; /* sizeof(encache_allocfuncs): set it first */
  void *(*malloc_fn)(size_t size);
  void *(*calloc_fn)(size_t n, size_t size);
  void *(*realloc_fn)(void *p, size_t size);
  void (*free_fn)(void *p);
  void *(*aligned_alloc_fn)(size_t alignment, size_t size);
} encache_allocfuncs;

ENCACHE_EXTERN int encache_set_allocators(const encache_allocfuncs *fns,
                                          encache_allocfuncs *old);

/* ----------------------------------------------------------------- dtypes */

/* Element types of an embedding matrix.  The values are the v3 wire codes
 * (docs/format.md): keep them. */
typedef enum encache_dtype {
  ENCACHE_FLOAT32 = 0,
  ENCACHE_FLOAT16 = 11,
  ENCACHE_BFLOAT16 = 12
} encache_dtype;

/* Size in bytes of one element, or 0 for a value that is not a dtype. */
ENCACHE_EXTERN size_t encache_dtype_size(int dtype);
/* "float32", "float16", "bfloat16", or NULL for a value that is not a
 * dtype.  Static storage. */
ENCACHE_EXTERN const char *encache_dtype_name(int dtype);
/* "torch.float32" etc. (as PyTorch prints it; used in keys), or NULL. */
ENCACHE_EXTERN const char *encache_dtype_torch_name(int dtype);
/* Parses "float32", "float16", "bfloat16" (also with a "torch." prefix,
 * and the aliases "fp32", "fp16", "bf16", "float", "half").  Returns the
 * dtype value (>= 0) or ENCACHE_EDTYPE. */
ENCACHE_EXTERN int encache_dtype_parse(const char *name);

/* ------------------------------------------------------------------- keys */

/*
 * A Store key is NAMESPACE "@id:" IDENTIFIER.  The namespace is computed
 * once per encoder from the components below, byte-exact with vLLM's
 * protocol:v3 (docs/format.md).  Nothing is escaped or hashed.
 */
typedef struct encache_namespace_params {
  size_t size;              /* sizeof(encache_namespace_params): set it */
  const char *prefix;       /* embedding_cache_prefix; NULL or "" = none */
  const char *model;        /* model identity, or the model path as given;
                               required (NULL is refused; "" is written
                               as vLLM writes an empty identity: "model:") */
  const char *revision;     /* NULL or "" = "default" */
  const char *encoder_hash; /* multimodal-config hash; NULL or "" = the
                               model has none ("encoder:encoder:default") */
  int dtype;                /* the model dtype: an encache_dtype */
} encache_namespace_params;

/*
 * Writes the namespace, NUL-terminated, into buf[0..size).
 * Returns its length (without the NUL) when it fits.  With buf NULL and
 * size 0, writes nothing and returns the length it needs (a size query).
 * Errors: ENCACHE_ENOBUFS if size <= length (buf untouched but for a NUL
 * at buf[0] when size > 0), ENCACHE_EINVAL for a missing model,
 * ENCACHE_EDTYPE for a bad dtype.  Never allocates.
 */
ENCACHE_EXTERN int encache_namespace(const encache_namespace_params *p,
                                     char *buf, size_t size);

/*
 * Writes the key NAMESPACE "@id:" ID into buf[0..size), with the same
 * return convention as encache_namespace().  ns and id must be non-NULL;
 * id must be non-empty.  Never allocates.
 */
ENCACHE_EXTERN int encache_key(const char *ns, const char *id, char *buf,
                               size_t size);

/*
 * The encoder field of an older vLLM (ENCACHE_VLLM_MM_FACTORS_2 below; the
 * newest vLLM hashes more: use encache_vllm_mm_hash()): the hex digest of
 * its MultiModalConfig.compute_hash(), MD5 of Python's str() of
 * [attention backend name or None, mm_encoder_tp_mode].  tp_mode is
 * "weights" (vLLM's default) or "data"; attn_backend is NULL or "" for
 * none (vLLM's default), else a backend name, upper-cased as vLLM does
 * ("flash_attn" -> "FLASH_ATTN").  Writes 32 hex digits and a NUL into
 * buf[0..size) for encache_namespace_params.encoder_hash.  Returns 32, or
 * ENCACHE_EINVAL (unknown tp_mode, a backend name that is not letters,
 * digits and '_') or ENCACHE_ENOBUFS (size < 33).  Never allocates.
 */
ENCACHE_EXTERN int encache_vllm_encoder_hash(const char *tp_mode,
                                             const char *attn_backend,
                                             char *buf, size_t size);

/*
 * Added in 1.3.  The factor lists vLLM's MultiModalConfig.compute_hash()
 * has hashed (docs/compatibility.md cites each by vLLM file and commit):
 *   ENCACHE_VLLM_MM_FACTORS_1  [backend]  (vllm/config/multimodal.py at
 *                              01230b40128e570a58e54e75f7e55c4d5cd9246d)
 *   ENCACHE_VLLM_MM_FACTORS_2  [backend, tp_mode]  (the same file at
 *                              55e847c01c4b10736b55f091531717e18c579817;
 *                              encache_vllm_encoder_hash() computes this one)
 *   ENCACHE_VLLM_MM_FACTORS_4  [backend, tp_mode, attn_dtype, fp8_scale_path]
 *                              (the newest, hashed by the vLLM versions that
 *                              carry mm_encoder_attn_dtype; the default)
 * ENCACHE_VLLM_MM_FACTORS_NEWEST (0) is ENCACHE_VLLM_MM_FACTORS_4.
 */
#define ENCACHE_VLLM_MM_FACTORS_NEWEST 0
#define ENCACHE_VLLM_MM_FACTORS_1 1
#define ENCACHE_VLLM_MM_FACTORS_2 2
#define ENCACHE_VLLM_MM_FACTORS_4 4

/* Added in 1.3.  The multimodal-config fields vLLM hashes; a field the
 * factor list does not hash is ignored.  Zero-initialise it and set size:
 * every NULL is vLLM's default. */
typedef struct encache_vllm_mm_config {
  size_t size;                /* sizeof(encache_vllm_mm_config): set it */
  int factors;                /* an ENCACHE_VLLM_MM_FACTORS_*; 0 = newest */
  const char *tp_mode;        /* mm_encoder_tp_mode: NULL = "weights" */
  const char *attn_backend;   /* mm_encoder_attn_backend: NULL or "" =
                                 None, else a name upper-cased as vLLM does */
  const char *attn_dtype;     /* mm_encoder_attn_dtype: NULL = None */
  const char *fp8_scale_path; /* mm_encoder_fp8_scale_path: NULL = None */
} encache_vllm_mm_config;

/*
 * Added in 1.3.  The encoder field vLLM writes for a multimodal model
 * whose multimodal config is c (NULL = vLLM's defaults, newest factor
 * list): the MD5 hex digest of Python's str() of the factor list.  Writes
 * 32 hex digits and a NUL into buf[0..size); returns 32, or ENCACHE_EINVAL
 * (an unknown factor list or tp_mode, a backend name that is not letters,
 * digits and '_', a string that is not printable ASCII: encache does not
 * spell Python's repr() of those) or ENCACHE_ENOBUFS (size < 33).  Never
 * allocates; any thread.
 */
ENCACHE_EXTERN int encache_vllm_mm_hash(const encache_vllm_mm_config *c,
                                        char *buf, size_t size);

/* ---------------------------------------------------------------- objects */

/*
 * A v3 object is a 24-byte little-endian header (magic, dtype code, rows,
 * cols) followed by rows * cols elements, row-major and contiguous.
 */
#define ENCACHE_HEADER_SIZE 24
#define ENCACHE_MAGIC 0x4D4F4F4Eu

/* A strided view of a tensor in host memory (or, added in 1.3, CUDA
 * memory: see `device`), as a serving stack holds it.  Strides
 * are in elements (as PyTorch and DLPack count them); NULL strides mean
 * row-major contiguous. */
typedef struct encache_tensor {
  size_t size; /* sizeof(encache_tensor): set it first */
  const void *data;
  int dtype; /* an encache_dtype; anything else is refused */
  int ndim;  /* only 2 is accepted */
  const int64_t *shape;
  const int64_t *strides;
  /* Added in 1.3: where `data` lives (a caller compiled against an older
   * header has host tensors).  device is an encache_device_kind,
   * device_index the CUDA device's ordinal (0 for host memory).  stream is
   * the caller's cudaStream_t the output is produced on (NULL = the legacy
   * default stream); encache_publish() orders its copy of the output
   * after the work queued on it so far (docs/engine.md, "Device outputs").
   * encache_header_encode() ignores all three. */
  int device;
  int device_index;
  void *stream;
} encache_tensor;

/* The decoded fields of a header. */
typedef struct encache_header {
  uint32_t magic;
  uint32_t dtype; /* the wire code, not necessarily a known dtype */
  uint64_t rows;
  uint64_t cols;
} encache_header;

/* What a reader expects of an object. */
typedef struct encache_contract {
  int dtype; /* an encache_dtype */
  uint64_t rows;
  uint64_t cols;
} encache_contract;

/* Why an object is not a hit for a contract (docs/format.md, in the
 * order they are checked). */
typedef enum encache_verdict {
  ENCACHE_COMPATIBLE = 0,
  ENCACHE_BAD_LENGTH = 1, /* byte count is not 24 + expected payload */
  ENCACHE_BAD_MAGIC = 2,
  ENCACHE_BAD_DTYPE = 3,
  ENCACHE_BAD_SHAPE = 4  /* rows/cols differ, even if the sizes agree */
} encache_verdict;

/* "compatible", "length", "magic", "dtype", "shape"; "unknown" otherwise. */
ENCACHE_EXTERN const char *encache_verdict_name(int verdict);

/*
 * Payload size of a rows x cols matrix of dtype, in *nbytes.
 * Errors: ENCACHE_EDTYPE, ENCACHE_ETOOLARGE (the object size 24 + payload
 * would not fit in 64 bits).
 */
ENCACHE_EXTERN int encache_payload_size(int dtype, uint64_t rows,
                                        uint64_t cols, uint64_t *nbytes);

/*
 * Encodes the header for tensor t into out.  Refuses, before writing
 * anything: a dtype that is not float32/float16/bfloat16 (ENCACHE_EDTYPE),
 * ndim != 2 or a negative dimension (ENCACHE_ESHAPE), a non-contiguous
 * layout (ENCACHE_ECONTIG; strides of dimensions of size 1 are ignored, as
 * PyTorch does), a size that overflows (ENCACHE_ETOOLARGE).
 */
ENCACHE_EXTERN int encache_header_encode(const encache_tensor *t,
                                         unsigned char out[ENCACHE_HEADER_SIZE]);

/*
 * Decodes the header at obj[0..len) into *hdr, without judging it: returns
 * 0 when len >= 24, or ENCACHE_EINCOMPAT (short header; *hdr zeroed).
 */
ENCACHE_EXTERN int encache_header_decode(const void *obj, size_t len,
                                         encache_header *hdr);

/*
 * Judges the object obj[0..len) against contract c: returns an
 * encache_verdict (ENCACHE_COMPATIBLE = 0 for a hit), checking length,
 * magic, dtype, shape in that order; hdr, when not NULL, receives whatever
 * header could be decoded (zeroed for a short header).  Returns
 * ENCACHE_EINVAL or ENCACHE_EDTYPE for a bad contract.
 */
ENCACHE_EXTERN int encache_object_check(const void *obj, size_t len,
                                        const encache_contract *c,
                                        encache_header *hdr);

/*
 * Describes, in buf, what a reader sees in obj[0..len) without a
 * contract: "float32 2x2, 16 payload bytes" or why it is not a v3 object
 * ("not a v3 object: bad magic 0x..."; "... length 30, expected 40").
 * Returns 0 for a well-formed v3 object, ENCACHE_EINCOMPAT otherwise;
 * buf is always NUL-terminated when size > 0.
 */
ENCACHE_EXTERN int encache_object_describe(const void *obj, size_t len,
                                           char *buf, size_t size);

/* ---------------------------------------------------------- configuration */

/*
 * The configuration of an encoder: the producer's vLLM
 * --ec-transfer-config JSON (options under ec_connector_extra_config) and,
 * optionally, the Mooncake Store client JSON named by MOONCAKE_CONFIG_PATH.
 * Both are conveniences: every option can also be set by its id with the
 * typed setters below, which fill the same fields through the same checks
 * (and give the same messages).  See docs/configuration.md.
 *
 * Lifetime: encache_config_new() creates an empty configuration holding
 * every default; each load replaces the section it reads, atomically: on
 * failure the handle keeps its previous values and errmsg() says why.
 */
typedef struct encache_config encache_config;

/*
 * Every option, once: XX(ID, SECTION, name, KIND, default, RULE, arg, doc).
 * SECTION is EC (vLLM's ec_transfer_config object), EXTRA (its
 * ec_connector_extra_config) or MOONCAKE (the Mooncake client JSON).
 * KIND says how a value is read and which setter takes it:
 *   BOOL    a JSON boolean                          set_bool
 *   TRUTHY  any JSON value, as Python's bool()      set_bool
 *   POSINT  an integer > 0                          set_u64
 *   VPOSINT (added in 1.3) an integer > 0 read as vLLM's _positive_int
 *           reads it: also an integral float (32.0) or a string Python's
 *           int() reads ("32"); not a boolean      set_u64
 *   UINT    an integer >= 0                         set_u64
 *   SIZE    bytes, or a string such as "4GB", as vLLM's _parse_size reads
 *           it                                      set_u64
 *   NUMBER  a number >= 0                           set_double
 *   STRING  a string                                set_string
 *   ENUM    a string among RULE ONE_OF's arg        set_string
 *   PYSTR   a key field: a string, or a null, boolean or number written
 *           as Python's str() writes it             set_string
 *   TENANT  a string or null, stripped, blank = "default"  set_string
 *   DERIVED not read: computed at load (no setter)
 * default is the value as JSON text (NULL = unset).  RULE is ANY,
 * REQUIRED, NONZERO (> 0), ONE_OF (arg: the '|'-separated choices),
 * RAM_STORE (false: a RAM Store is required), DEFAULT_TENANT (only
 * "default"), KEY_PREFIX or KEY_MODEL (the key field the value becomes).
 * The ids are ENCACHE_OPT_ID; new options are appended, so an id keeps
 * its value within a major version.
 */
#define ENCACHE_OPTION_MAP(XX)                                               \
  XX(EC_CONNECTOR, EC, ec_connector, STRING, NULL, ANY, NULL,                \
     "the connector vLLM loads (encache checks the type only)")              \
  XX(EC_ROLE, EC, ec_role, ENUM, NULL, ONE_OF,                               \
     "ec_producer|ec_consumer|ec_both",                                      \
     "the instance's role; required when ec_connector is set, as vLLM "      \
     "requires it")                                                          \
  XX(ENGINE_ID, EC, engine_id, STRING, NULL, ANY, NULL,                      \
     "vLLM's engine identifier")                                             \
  XX(EC_CONNECTOR_MODULE_PATH, EC, ec_connector_module_path, STRING, NULL,   \
     ANY, NULL, "the module vLLM imports the connector from")                \
  XX(EC_BUFFER_DEVICE, EC, ec_buffer_device, STRING, NULL, ANY, NULL,        \
     "vLLM's transfer buffer device")                                        \
  XX(EC_BUFFER_SIZE, EC, ec_buffer_size, NUMBER, NULL, ANY, NULL,            \
     "vLLM's transfer buffer size")                                          \
  XX(EC_IP, EC, ec_ip, STRING, NULL, ANY, NULL, "vLLM's connector address")  \
  XX(EC_PORT, EC, ec_port, UINT, NULL, ANY, NULL, "vLLM's connector port")   \
  XX(EC_RANK, EC, ec_rank, UINT, NULL, ANY, NULL, "vLLM's connector rank")   \
  XX(EC_PARALLEL_SIZE, EC, ec_parallel_size, POSINT, NULL, ANY, NULL,        \
     "vLLM's connector parallel size")                                       \
  XX(CROSS_ENCODER_CACHE, EXTRA, cross_encoder_cache, BOOL, "false", ANY,    \
     NULL,                                                                   \
     "reuse encoder outputs across encoders; when false nothing is "         \
     "created: no Store client, no publisher")                               \
  XX(EMBEDDING_CACHE_PREFIX, EXTRA, embedding_cache_prefix, PYSTR, "\"\"",   \
     KEY_PREFIX, NULL,                                                       \
     "the namespace prefix, as vLLM writes it: Python's str() of the JSON "  \
     "value (null gives None@; true, 7, 1.5 as Python prints them); "        \
     "objects and arrays are refused")                                       \
  XX(EMBEDDING_MODEL_IDENTITY, EXTRA, embedding_model_identity, PYSTR, NULL, \
     KEY_MODEL, NULL,                                                        \
     "replaces the key's model field (unset: the model path), written the "  \
     "same way: null gives model:None, \"\" gives model:")                   \
  XX(STORE_MAX_PENDING_ITEMS, EXTRA, store_max_pending_items, VPOSINT, "32", \
     ANY, NULL, "outputs queued for the background writer at most")          \
  XX(STORE_MAX_PENDING_BYTES, EXTRA, store_max_pending_bytes, VPOSINT,       \
     "2147483648", ANY, NULL,                                                \
     "bytes queued for the background writer at most")                       \
  XX(STORE_READ_BUFFER_BYTES, EXTRA, store_read_buffer_bytes, VPOSINT,       \
     "134217728", ANY, NULL, "the staging buffer a lookup reads into")       \
  XX(LOCAL_HOSTNAME, MOONCAKE, local_hostname, DERIVED, NULL, ANY, NULL,     \
     "not read, as vLLM does not read it: "                                  \
     "MOONCAKE_REQUESTER_LOCAL_HOSTNAME, else VLLM_HOST_IP, else the "       \
     "local address of the route to 8.8.8.8")                                \
  XX(METADATA_SERVER, MOONCAKE, metadata_server, STRING, NULL, REQUIRED,     \
     NULL, "\"P2PHANDSHAKE\" or an http URL")                                \
  XX(MASTER_SERVER_ADDRESS, MOONCAKE, master_server_address, STRING, NULL,   \
     REQUIRED, NULL, "the Mooncake master, host:port")                       \
  XX(PROTOCOL, MOONCAKE, protocol, STRING, "\"rdma\"", ANY, NULL,            \
     "the transfer protocol (vLLM's default; \"tcp\" over TCP)")             \
  XX(DEVICE_NAME, MOONCAKE, device_name, STRING, "\"\"", ANY, NULL,          \
     "the RDMA device(s)")                                                   \
  XX(MODE, MOONCAKE, mode, ENUM, "\"embedded\"", ONE_OF,                     \
     "embedded|standalone-store",                                            \
     "embedded contributes global_segment_size > 0; standalone-store is a "  \
     "pure client and needs global_segment_size 0")                          \
  XX(GLOBAL_SEGMENT_SIZE, MOONCAKE, global_segment_size, SIZE,               \
     "4294967296", ANY, NULL,                                                \
     "RAM this process contributes to the Store (see mode)")                 \
  XX(LOCAL_BUFFER_SIZE, MOONCAKE, local_buffer_size, SIZE, "4294967296",     \
     NONZERO, NULL, "the client's transfer buffer")                          \
  XX(ENABLE_OFFLOAD, MOONCAKE, enable_offload, TRUTHY, "false", RAM_STORE,   \
     NULL, "offload to SSD; refused: encache requires a RAM Store")          \
  XX(TENANT_ID, MOONCAKE, tenant_id, TENANT, "\"default\"", DEFAULT_TENANT,  \
     NULL,                                                                   \
     "another tenant is refused: the Mooncake C ABI encache loads takes no " \
     "tenant, so the client would join the default one")                     \
  XX(SINGLE_FLIGHT, EXTRA, single_flight, BOOL, "false", ANY, NULL,          \
     "encache's own (vLLM ignores it): a lookup that misses takes a lease "  \
     "on the key, so that one encoder encodes it while the others wait "     \
     "for its output (single_flight_wait_ms) or answer IN_FLIGHT; needs a "  \
     "Store with leases (shm, Redis), else it does nothing")                 \
  XX(SINGLE_FLIGHT_TTL_MS, EXTRA, single_flight_ttl_ms, POSINT, "5000", ANY, \
     NULL,                                                                   \
     "how long a lease lasts when its holder never publishes (about one "    \
     "encode; on shm a holder that dies loses it at once)")                  \
  XX(SINGLE_FLIGHT_WAIT_MS, EXTRA, single_flight_wait_ms, UINT, "0", ANY,    \
     NULL,                                                                   \
     "how long a lookup waits for another encoder's output before it "       \
     "answers IN_FLIGHT (0: at once); the caller's bound per lookup")      \
  XX(DEVICE_PINNED_POOL_BYTES, EXTRA, device_pinned_pool_bytes, POSINT,     \
     "268435456", ANY, NULL,                                                 \
     "encache's own (added in 1.3): the page-locked host memory that "       \
     "publications of CUDA outputs are copied into, at most; a "             \
     "publication that finds no room is skipped as OVER_BYTES, counted "    \
     "in device_pool_full")                                                  \
  XX(DEVICE_SYNC_TIMEOUT_MS, EXTRA, device_sync_timeout_ms, POSINT, "10000", \
     ANY, NULL,                                                              \
     "encache's own (added in 1.3): how long encache waits for a CUDA copy " \
     "to complete; one that does not poisons the handle")                    \
  XX(STATS_SEGMENT, EXTRA, stats_segment, STRING, NULL, ANY, NULL,           \
     "encache's own (added in 1.3): the host-local shared-memory registry "  \
     "where the handle publishes its counters and latency histograms for "   \
     "encache stats, exporter and top (unset: $ENCACHE_STATS_SEGMENT, else " \
     "\"encache.fleet.UID\", one per user; \"\" or \"off\": none); a "        \
     "registry that cannot be used (or that another user owns or may "       \
     "write) is a warning, never a failed open")                             \
  XX(ENCODER_NAME, EXTRA, encoder_name, STRING, NULL, ANY, NULL,             \
     "encache's own (added in 1.3): the encoder's label in the registry "    \
     "(unset: PID@HOSTNAME)")                                                \
  XX(STORE_WRITES_IN_FLIGHT, EXTRA, store_writes_in_flight, UINT, "0", ANY,  \
     NULL,                                                                   \
     "encache's own (added in 1.3): how many writes the background "         \
     "publisher keeps in flight, 1 to 8; 0: the Store's choice (2 on a "     \
     "Store shared with other processes, 1 on one whose client waits by "    \
     "polling a CPU, as Mooncake's does, and on a private one)")              \
  XX(STORE_READS_IN_FLIGHT, EXTRA, store_reads_in_flight, UINT, "0", ANY,    \
     NULL,                                                                   \
     "encache's own (added in 1.3): how many started lookups "               \
     "(encache_lookup_start) read the Store at once, 1 to 8, each on a "     \
     "lookup thread of its own, with its own staging buffer where reads "    \
     "use one (store_read_buffer_bytes each, besides the handle's own); "    \
     "0: the Store's choice, as for store_writes_in_flight")

typedef enum encache_option {
#define ENCACHE_OPT_ENUM_(id, ...) ENCACHE_OPT_##id,
  ENCACHE_OPTION_MAP(ENCACHE_OPT_ENUM_)
#undef ENCACHE_OPT_ENUM_
  ENCACHE_OPT_COUNT
} encache_option;

/* Creates a configuration with all defaults.  Free with
 * encache_config_free().  Errors: ENCACHE_ENOMEM. */
ENCACHE_EXTERN int encache_config_new(encache_config **out);
ENCACHE_EXTERN void encache_config_free(encache_config *cfg);

/* Parses the whole vLLM ec-transfer-config object from json[0..len).
 * Errors: ENCACHE_EJSON (message has line and column), ENCACHE_ECONFIG
 * (message names the field), ENCACHE_ENOMEM. */
ENCACHE_EXTERN int encache_config_load_ec(encache_config *cfg,
                                          const char *json, size_t len);

/* Parses a Mooncake client JSON from json[0..len); `origin` (may be NULL)
 * names where it came from, for messages.  Errors as above. */
ENCACHE_EXTERN int encache_config_load_mooncake(encache_config *cfg,
                                                const char *json, size_t len,
                                                const char *origin);

/* Reads and parses the Mooncake JSON file at path; with path NULL, the file
 * named by MOONCAKE_CONFIG_PATH (ENCACHE_ECONFIG if it is unset).  Errors
 * as above, plus -errno when the file cannot be read. */
ENCACHE_EXTERN int encache_config_load_mooncake_file(encache_config *cfg,
                                                     const char *path);

/*
 * Typed setters: set option `id` as the JSON member would (same kind
 * checks, same rule, same message in errmsg(), same warnings), without
 * JSON.  set_bool takes BOOL and TRUTHY options (any non-zero is true),
 * set_u64 POSINT, UINT and SIZE, set_double NUMBER, set_string the string
 * kinds (copied; NULL = as if absent, the default).  A call either sets
 * the option or leaves cfg unchanged.  Setting a MOONCAKE option puts the
 * mooncake section in use (listed, and checked by validate()).
 * Errors: ENCACHE_EINVAL (id out of range, a setter of another kind, a
 * DERIVED option), ENCACHE_ECONFIG (the value breaks the rule; the message
 * names "section.option"), ENCACHE_ENOMEM.
 */
ENCACHE_EXTERN int encache_config_set_bool(encache_config *cfg,
                                           encache_option id, int value);
ENCACHE_EXTERN int encache_config_set_u64(encache_config *cfg,
                                          encache_option id, uint64_t value);
ENCACHE_EXTERN int encache_config_set_double(encache_config *cfg,
                                             encache_option id, double value);
ENCACHE_EXTERN int encache_config_set_string(encache_config *cfg,
                                             encache_option id,
                                             const char *value);
/* Returns option `id` to its default, as if it were absent. */
ENCACHE_EXTERN int encache_config_reset(encache_config *cfg,
                                        encache_option id);

/* The rules between options, for a configuration built with the setters
 * (a load checks them itself): ec_role with ec_connector; with the mooncake
 * section in use, its required options and mode against
 * global_segment_size; then the derived local_hostname.  Errors:
 * ENCACHE_ECONFIG naming the option, ENCACHE_ENOMEM. */
ENCACHE_EXTERN int encache_config_validate(encache_config *cfg);

/* Typed getters by id: the option's value (a default when not given).
 * Strings are owned by cfg, valid until the option changes or cfg is
 * freed, NULL when unset.  Errors: ENCACHE_EINVAL (id out of range, or
 * an option of another kind: the kinds are those of the setters). */
ENCACHE_EXTERN int encache_config_bool(const encache_config *cfg,
                                       encache_option id, int *out);
ENCACHE_EXTERN int encache_config_u64(const encache_config *cfg,
                                      encache_option id, uint64_t *out);
ENCACHE_EXTERN int encache_config_double(const encache_config *cfg,
                                         encache_option id, double *out);
ENCACHE_EXTERN int encache_config_string(const encache_config *cfg,
                                         encache_option id, const char **out);

/* 1 when option id has a value (given, or a default), 0 when it is unset
 * (no default and not given: its getter reads 0, false or NULL).
 * ENCACHE_EINVAL for a NULL cfg or an id out of range. */
ENCACHE_EXTERN int encache_config_is_set(const encache_config *cfg,
                                         encache_option id);

/* The same by name ("store_read_buffer_bytes", or "section.name").
 * Errors: ENCACHE_ENOENT for an unknown name, ENCACHE_EINVAL when the
 * option has another kind. */
ENCACHE_EXTERN int encache_config_get_bool(const encache_config *cfg,
                                           const char *name, int *out);
ENCACHE_EXTERN int encache_config_get_u64(const encache_config *cfg,
                                          const char *name, uint64_t *out);
ENCACHE_EXTERN int encache_config_get_string(const encache_config *cfg,
                                             const char *name,
                                             const char **out);

/* Metadata of option `id`, from ENCACHE_OPTION_MAP, for listings: static
 * strings, NULL for an id out of range.  section: "ec_transfer_config",
 * "ec_connector_extra_config" or "mooncake"; type: the kind in words
 * ("positive integer", "size", ...); default: JSON text, NULL when the
 * option has none; rule: in words, "" when there is none. */
ENCACHE_EXTERN const char *encache_option_name(encache_option id);
ENCACHE_EXTERN const char *encache_option_section(encache_option id);
ENCACHE_EXTERN const char *encache_option_type(encache_option id);
ENCACHE_EXTERN const char *encache_option_default(encache_option id);
ENCACHE_EXTERN const char *encache_option_rule(encache_option id);
ENCACHE_EXTERN const char *encache_option_doc(encache_option id);
/* The id of "name" or "section.name", or ENCACHE_ENOENT. */
ENCACHE_EXTERN int encache_option_find(const char *name);

/* Deployment facts that decide whether reuse may start (docs/configuration.md):
 * the processor cache size (identifiers are content hashes only when it is
 * on), and the parallelism the encoder runs with.  Fill it with
 * encache_deployment_defaults(), which sets size. */
typedef struct encache_deployment {
  size_t size;                  /* sizeof(encache_deployment) */
  double mm_processor_cache_gb; /* vLLM's default is 4; 0 = off */
  int tensor_parallel_size;     /* must be 1 */
  int pipeline_parallel_size;   /* must be 1 */
  int data_parallel_size;       /* must be 1 */
  int dynamic_lora;             /* must be 0 */
} encache_deployment;

/* Fills *d with vLLM's defaults (4 GB cache, no parallelism, no LoRA) and
 * its size.  Inline, so that size is the one the caller compiled with. */
static inline void encache_deployment_defaults(encache_deployment *d) {
  if (d == NULL)
    return;
  d->size = sizeof(*d);
  d->mm_processor_cache_gb = 4;
  d->tensor_parallel_size = 1;
  d->pipeline_parallel_size = 1;
  d->data_parallel_size = 1;
  d->dynamic_lora = 0;
}

/* Checks that reuse may start for deployment d (NULL = defaults).  When
 * cross_encoder_cache is false there is nothing to check and it returns 0.
 * Errors: ENCACHE_ECONFIG naming the setting that forbids it,
 * ENCACHE_EINVAL for a d->size this library does not know. */
ENCACHE_EXTERN int encache_config_check_deployment(
    encache_config *cfg, const encache_deployment *d);

/*
 * The namespace of an encoder with this configuration, exactly as vLLM's
 * build_embedding_namespace() writes it: the prefix and model identity
 * are the options as Python's str() writes their JSON values (null is
 * "None", true "True"; an empty identity gives "model:"); `model` (the
 * model path as given) is used only when embedding_model_identity is
 * absent.  revision, encoder_hash and dtype as in encache_namespace_params.
 * Same return convention as encache_namespace(); ENCACHE_EINVAL when the
 * identity is absent and model is NULL or empty.
 */
ENCACHE_EXTERN int encache_config_namespace(const encache_config *cfg,
                                            const char *model,
                                            const char *revision,
                                            const char *encoder_hash,
                                            int dtype, char *buf, size_t size);

/* Warnings about what was loaded or set (a key field vLLM writes in a
 * surprising way, a member vLLM ignores), one sentence each, naming the
 * field and what resulted.  Strings owned by cfg, valid until the next
 * load, set or free; warning_at returns NULL for an index out of range. */
ENCACHE_EXTERN int encache_config_warning_count(const encache_config *cfg);
ENCACHE_EXTERN const char *encache_config_warning_at(const encache_config *cfg,
                                                     int i);

/* The message of the last failed call on cfg, or "" after a success.
 * Valid until the next call on cfg. */
ENCACHE_EXTERN const char *encache_config_errmsg(const encache_config *cfg);

/* One effective option, for display (the check command).  The caller sets
 * size = sizeof(encache_config_item) before item_at fills the rest. */
typedef struct encache_config_item {
  size_t size;
  const char *section; /* "ec_transfer_config",
                          "ec_connector_extra_config" or "mooncake" */
  const char *name;
  const char *value;   /* the value as JSON text ("null" when unset) */
  int is_default;      /* 1 when the value was not given */
} encache_config_item;

/* Number of items: every known option of every section in use (the ec
 * sections always; mooncake once loaded or set). */
ENCACHE_EXTERN int encache_config_item_count(const encache_config *cfg);
/* Fills *item for index i (0-based).  Strings are owned by cfg and valid
 * until the next load, set or free.  Errors: ENCACHE_EINVAL (index, or an
 * item->size this library does not know). */
ENCACHE_EXTERN int encache_config_item_at(const encache_config *cfg, int i,
                                          encache_config_item *item);

/* Options present in the input that encache does not know, as
 * "section.name".  They are not errors (vLLM ignores them too).  Same
 * lifetime as items. */
ENCACHE_EXTERN int encache_config_unknown_count(const encache_config *cfg);
ENCACHE_EXTERN const char *encache_config_unknown_at(const encache_config *cfg,
                                                     int i);

/*
 * Parses a size: a plain integer of bytes, or a number with a unit
 * B, KB, MB, GB, TB (binary multiples, as Mooncake reads them), KiB, MiB,
 * GiB, TiB; case-insensitive, optional space.  Errors: ENCACHE_EINVAL
 * (not a size), ENCACHE_ETOOLARGE (overflows 64 bits).
 */
ENCACHE_EXTERN int encache_parse_size(const char *text, uint64_t *out);

/* ----------------------------------------------------------------- stores */

/*
 * A Store holds objects under keys.  The engine talks to one through this
 * handle; operators' tools use it directly.  Stores are opened from a URL:
 *
 *   shm://NAME?size=SIZE[&lock_timeout_ms=MS]
 *        the embedded shared-memory Store: every process on the host that
 *        opens NAME shares one segment (created by the first, sized SIZE,
 *        default 1GiB; later openers use the existing segment whatever its
 *        size).  It outlives processes until encache_shm_destroy().
 *   redis://[user:password@]host:port[/db], unix:///path,
 *   redis-cluster://[user:password@]host:port[,host:port...]
 *        Redis or Valkey, single node or Redis Cluster.  Options
 *        (?k=v&...; docs/stores.md): connect_timeout_ms, timeout_ms,
 *        ttl_s, db (unix://), password_file=PATH.  The password (AUTH) is
 *        the URL's (percent-decoded), else the first line of
 *        password_file, else $ENCACHE_REDIS_PASSWORD: the last two keep
 *        it out of command lines.  It never appears in a message.
 *   mooncake:  or  mooncake:PATH
 *        Mooncake Store, through libmooncake_store.so loaded at run time
 *        ($ENCACHE_MOONCAKE_LIBRARY); the client JSON is PATH, else the
 *        file named by $MOONCAKE_CONFIG_PATH.
 *
 * See docs/stores.md.  ENCACHE_DEFAULT_STORE is used when no URL is given.
 *
 * Results are classified once, in the backend:
 *   >= 0                 success (a byte count for reads)
 *   ENCACHE_ENOENT       not found
 *   ENCACHE_ETOOLARGE    the object does not fit the buffer (reads) or the
 *                        Store (writes); nothing was written
 *   ENCACHE_EEXIST       writes: the key exists (or is being written);
 *                        the Store never replaces an object
 *   ENCACHE_EUNAVAIL     recoverable: the operation certainly did not happen
 *                        (or certainly finished); try again later
 *   ENCACHE_EUNCONFIRMED fatal: completion cannot be confirmed, the Store may
 *                        still write into the caller's memory
 *   ENCACHE_EINVAL       bad arguments
 *
 * Thread safety: a Store handle may be used by several threads at once.
 * A handle must not be used in a child after fork(): open a new one (an
 * shm handle answers ENCACHE_EINVAL there).
 */
typedef struct encache_store encache_store;

/* What a Store's answer (a result code above, per item or for a batch)
 * means for the caller.  encache_store_classify() is the one place that
 * maps codes to these: the engine asks it and nothing else. */
typedef enum encache_answer {
  ENCACHE_ANSWER_OK = 0,       /* >= 0: done (a count, a size, 1 = present) */
  ENCACHE_ANSWER_ABSENT = 1,   /* ENCACHE_ENOENT: not there */
  ENCACHE_ANSWER_EXISTS = 2,   /* ENCACHE_EEXIST: writes: already there */
  ENCACHE_ANSWER_TOO_LARGE = 3,/* ENCACHE_ETOOLARGE: nothing was written */
  ENCACHE_ANSWER_RECOVERABLE = 4, /* certainly not done: ENCACHE_EUNAVAIL,
                                     ENCACHE_EINVAL, ENCACHE_ENOMEM */
  ENCACHE_ANSWER_UNCONFIRMED = 5  /* ENCACHE_EUNCONFIRMED and any other
                                     code: completion unknown, poison */
} encache_answer;

/* The encache_answer of a Store result code. */
ENCACHE_EXTERN int encache_store_classify(int64_t rc);

#define ENCACHE_DEFAULT_STORE "shm://encache?size=1GiB"

/* Opens the Store at url (NULL = $ENCACHE_STORE, else
 * ENCACHE_DEFAULT_STORE; an empty string is refused, ENCACHE_EURL, never
 * taken for the default).  The scheme picks the backend: the built-in
 * ones above, or one registered with encache_store_register().  On
 * failure *out is NULL and encache_store_errmsg(NULL) says why.  Errors:
 * ENCACHE_EURL, ENCACHE_EFORMAT (an incompatible or corrupted shared
 * segment), ENCACHE_ENOLIB (Mooncake's library is missing),
 * ENCACHE_ECONFIG, ENCACHE_EUNAVAIL (Mooncake setup failed), -errno,
 * ENCACHE_ENOMEM. */
ENCACHE_EXTERN int encache_store_open(const char *url, encache_store **out);
/* Closes the handle; NULL is a no-op.  Objects stay in the Store. */
ENCACHE_EXTERN void encache_store_close(encache_store *st);
/* Why the calling thread's last failed call on st failed ("" when that
 * thread's last failure was on another handle, or none); with st NULL,
 * why its last encache_store_open() failed.  Messages are kept per
 * thread, so threads sharing a handle never see each other's.  Valid
 * until that thread's next failing Store call.  Never NULL. */
ENCACHE_EXTERN const char *encache_store_errmsg(const encache_store *st);
/* The URL the handle was opened with, its password (if any) redacted as
 * by encache_store_url_redact().  Owned by st. */
ENCACHE_EXTERN const char *encache_store_url(const encache_store *st);

/*
 * Writes url with its password replaced by "***" into buf[0..size):
 * any scheme://user:password@rest becomes scheme://user:***@rest (and
 * scheme://:password@rest scheme://:***@rest); a URL without a password
 * is written as it is.  The credentials end at the last '@' before the
 * query ('?'), so '@', ':' and '/' may appear raw in a password
 * (percent-encode '?' as %3F).  A tier: URL is redacted part by part
 * (since 1.3).  Every message of the library, and
 * encache_store_url(), show URLs in this form; a program that prints a
 * Store URL should too.  Same return convention as encache_namespace():
 * the length, ENCACHE_ENOBUFS (buf[0] = 0), a size query with buf NULL
 * and size 0; ENCACHE_EINVAL for url NULL.  Never allocates; any thread.
 */
ENCACHE_EXTERN int encache_store_url_redact(const char *url, char *buf,
                                            size_t size);

/* For each of keys[0..n): results[i] = 1 present, 0 absent, or a negative
 * classified code.  Returns 0, or a negative code when the whole batch
 * failed (then results are unspecified). */
ENCACHE_EXTERN int encache_store_exists(encache_store *st,
                                        const char *const *keys, size_t n,
                                        int *results);

/* Reads each of keys[0..n) into bufs[i] (capacity caps[i]); results[i] is
 * the object's byte count or a negative classified code (ENCACHE_ENOENT,
 * ENCACHE_ETOOLARGE when it exceeds caps[i]: nothing beyond caps[i] is
 * ever written).  Returns 0, or a negative code for the whole batch. */
ENCACHE_EXTERN int encache_store_read(encache_store *st,
                                      const char *const *keys, size_t n,
                                      void *const *bufs, const size_t *caps,
                                      int64_t *results);

/* Byte count of the object at key in *len.  Errors: ENCACHE_ENOENT, ... */
ENCACHE_EXTERN int encache_store_object_size(encache_store *st,
                                             const char *key, uint64_t *len);

/* Writes hdr[0..hdr_len) followed by payload[0..len) as one object under
 * key, unless key exists (ENCACHE_EEXIST).  Readers never see a partial
 * object.  Either part may be empty. */
ENCACHE_EXTERN int encache_store_write(encache_store *st, const char *key,
                                       const void *hdr, size_t hdr_len,
                                       const void *payload, size_t len);

/* Removes the object at key.  Errors: ENCACHE_ENOENT. */
ENCACHE_EXTERN int encache_store_remove(encache_store *st, const char *key);

/* Calls cb(key, byte_count, arg) for each object whose key matches the
 * shell pattern (fnmatch(3); NULL = all), in no particular order; stops
 * early when cb returns non-zero and returns that value.  The key string
 * is valid during the callback only.  Backends that cannot list return
 * ENCACHE_EINVAL. */
ENCACHE_EXTERN int encache_store_list(encache_store *st, const char *pattern,
                                      int (*cb)(const char *key, uint64_t len,
                                                void *arg),
                                      void *arg);

/*
 * Added in 1.2: removing every object under a key prefix, for purging
 * an old namespace (the objects of namespace NS are the keys that start
 * with NS "@id:", docs/format.md; `encache purge`).  prefix must not be
 * empty.  Keys are matched as bytes, exactly: '*', '?', '[' and '\' in
 * prefix are plain characters, never patterns.
 *
 * encache_store_remove_prefix() removes them and counts the objects it
 * removed in *removed (may be NULL; set also when the call fails part
 * way).  A backend with ENCACHE_STORE_CAP_REMOVE_PREFIX does it its own
 * way (Redis: SCAN + UNLINK in batches on every master; Mooncake: remove
 * by an anchored, escaped regex, which skips objects under a read lease);
 * any other lists the prefix (ENCACHE_STORE_CAP_LIST) and removes each
 * object (one already gone is not an error).  A Store that can do
 * neither answers ENCACHE_EINVAL.  Objects written during the call may
 * stay; nothing outside the prefix is ever removed.
 *
 * encache_store_count_prefix() counts them without removing anything:
 * *objects and *bytes (either may be NULL).  It needs
 * ENCACHE_STORE_CAP_LIST (Mooncake cannot count: ENCACHE_EINVAL).
 *
 * Both return 0 or a negative code with encache_store_errmsg() set; any
 * thread (they take the time of a listing: not for an encoder's path).
 */
ENCACHE_EXTERN int encache_store_remove_prefix(encache_store *st,
                                               const char *prefix,
                                               uint64_t *removed);
ENCACHE_EXTERN int encache_store_count_prefix(encache_store *st,
                                              const char *prefix,
                                              uint64_t *objects,
                                              uint64_t *bytes);

/*
 * Added in 1.3: the namespaces present in a Store, so that an operator can
 * see what every encoder writes (the vLLM ones included) and align with it
 * (`encache namespaces`).  A key's namespace is everything before its
 * "@id:" (the one that ends "@protocol:v3" when there is one, so that an
 * identifier or a field holding "@id:" does not move the cut); keys with
 * no "@id:" are tallied under "".  Calls cb once per namespace, sorted
 * bytewise, with its object count and bytes (the objects' byte counts,
 * headers included); ns is valid during the callback only.  Stops early
 * when cb returns non-zero and returns that value; else returns the
 * number of namespaces (0 for an empty Store).  It lists every key (needs
 * ENCACHE_STORE_CAP_LIST: shm, Redis, Redis Cluster, tier; Mooncake's C
 * ABI cannot list, ENCACHE_EINVAL saying so); a key listed twice (Redis's
 * SCAN may) counts once.  Errors also ENCACHE_ETOOLARGE (more than 4096
 * namespaces), ENCACHE_ENOMEM, a Store's code; encache_store_errmsg()
 * says why.  Any thread; the time of a listing (not for an encoder's path).
 */
typedef struct encache_namespace_count {
  size_t size;     /* sizeof(encache_namespace_count) of this library */
  const char *ns;  /* the namespace */
  uint64_t objects;
  uint64_t bytes;
} encache_namespace_count;

ENCACHE_EXTERN int encache_store_namespaces(
    encache_store *st,
    int (*cb)(const encache_namespace_count *c, void *arg), void *arg);

/*
 * Added in 1.3: a time bound on the calls of st that walk its keys
 * (encache_store_list(), encache_store_remove_prefix(),
 * encache_store_count_prefix(), encache_store_namespaces()), so that a
 * command an operator runs ends by a time they chose (`encache ls`,
 * `purge`, `namespaces`: --timeout).  Each such call started afterwards
 * stops once timeout_ms have passed since it began: ENCACHE_EUNAVAIL,
 * encache_store_errmsg() saying where it stopped (what a remove_prefix
 * removed until then is counted).  0, the default: no time bound, only
 * the bounds of the walk itself (docs/stores.md, "Bounded listings").
 * Redis and Redis Cluster check it before each SCAN (a call's own wait is
 * bounded by the URL's timeout_ms); a tier passes it to both its tiers;
 * an shm walk is bounded by its segment and Mooncake's removal is one
 * call, so they need none; a backend of yours is not told.  Returns 0,
 * or ENCACHE_EINVAL (st NULL).  Any thread; set it before the calls it
 * should bound.
 */
ENCACHE_EXTERN int encache_store_set_list_timeout(encache_store *st,
                                                  uint32_t timeout_ms);

/*
 * Added in 1.2: single-flight leases (docs/engine.md, "Single flight").  A
 * lease on an object's key says "an encoder is producing this object":
 * one holder at a time, for at most ttl_ms, identified by a token (any
 * value but 0, random per lease).  Leases are kept apart from objects (a
 * lease is never an object, and is never listed, read or purged as one).
 *
 * encache_store_lease_take(): 0 when token now holds the lease of key
 * (taken, or already its own: then its deadline is renewed);
 * ENCACHE_EEXIST when another holder has it; else a Store code
 * (ENCACHE_EUNAVAIL, ...).  encache_store_lease_drop(): 0 when token held
 * the lease and it is gone; ENCACHE_ENOENT when token does not hold it
 * (it expired, its holder was declared dead, or another took it over);
 * else a Store code.  A holder's lease ends at its deadline; on shm also
 * at once when its process dies.  Without ENCACHE_STORE_CAP_LEASE both
 * answer ENCACHE_EINVAL.  Any thread.
 */
ENCACHE_EXTERN int encache_store_lease_take(encache_store *st,
                                            const char *key, uint64_t token,
                                            uint32_t ttl_ms);
ENCACHE_EXTERN int encache_store_lease_drop(encache_store *st,
                                            const char *key, uint64_t token);

/* Counters of a Store; fields a backend does not know are UINT64_MAX. */
typedef struct encache_store_stats {
  size_t size;          /* sizeof(encache_store_stats): set it first */
  const char *kind;     /* "shm", ...; static storage */
  uint64_t objects;     /* objects stored */
  uint64_t bytes_used;  /* bytes held, including per-object overhead */
  uint64_t capacity;    /* bytes available for objects */
  uint64_t evictions;   /* objects evicted to make room */
  uint64_t reinsertions;/* objects given a second chance at eviction */
  uint64_t repairs;     /* shm: repairs of the index (a process died
                           holding the lock, or damage was found) and
                           objects dropped because their checksum failed */
  /* Added in 1.3: the tiered Store's counters (tier:..., docs/stores.md),
   * this handle's since it was opened; UINT64_MAX on other Stores.  The
   * fields above are then the local tier's. */
  uint64_t tier_local_hits;        /* objects read from the local tier */
  uint64_t tier_remote_hits;       /* objects read from the remote tier */
  uint64_t tier_remote_errors;     /* items the remote tier failed */
  uint64_t tier_promotions_queued; /* remote hits queued for the local tier */
  uint64_t tier_promotions_done;   /* ... and now in it */
  uint64_t tier_promotions_dropped;/* not promoted: queue full, out of
                                      memory, malformed object, refused by
                                      the local tier, gone when read again,
                                      cancelled by a removal, served by the
                                      remote without its check (1.3) */
} encache_store_stats;

ENCACHE_EXTERN int encache_store_stats_get(encache_store *st,
                                           encache_store_stats *stats);

/* ------------------------------------------------------- your own Store */

/*
 * A Store of your own, in the spirit of SQLite's VFS: fill an
 * encache_store_backend, make handles with encache_store_new() from your
 * open function, and register that function for a URL scheme; then
 * encache_store_open("yours://...") and the engine's store_url reach it
 * as they reach the built-in Stores (docs/library.md shows a whole one).
 *
 * Every operation gets the handle; encache_store_data() gives back the
 * pointer you passed to encache_store_new().  An operation answers with
 * the codes listed at encache_store (per item in results[], or for the
 * whole call), and records why it failed with encache_store_fail(): that
 * is the detail encache_store_errmsg() shows.  Operations may be called
 * from several threads at once on one handle.
 */
#define ENCACHE_STORE_BACKEND_VERSION 1

/* What a backend offers beyond the required operations (exists, read,
 * object_size, write, remove, stats, close). */
typedef enum encache_store_caps {
  /* Memory must be registered before reads land in it or writes leave
   * from it: register_buffer and unregister_buffer are given. */
  ENCACHE_STORE_CAP_REGISTER = 1u << 0,
  /* read_split is given: reads land straight in their destinations. */
  ENCACHE_STORE_CAP_READ_SPLIT = 1u << 1,
  /* list is given. */
  ENCACHE_STORE_CAP_LIST = 1u << 2,
  /* write is an atomic put-if-absent: of two writers of one key, one
   * gets ENCACHE_EEXIST.  Without it the engine still checks existence
   * before writing, but two writers may both write. */
  ENCACHE_STORE_CAP_PUT_IF_ABSENT = 1u << 3,
  /* Objects are shared with other processes of the host or the fleet
   * (not only this process). */
  ENCACHE_STORE_CAP_SHARED = 1u << 4,
  /* Added in 1.2: remove_prefix is given (a table of the 1.0 size,
   * which ends before it, never sets this flag). */
  ENCACHE_STORE_CAP_REMOVE_PREFIX = 1u << 5,
  /* Added in 1.2: lease_take and lease_drop are given (single-flight
   * leases, encache_store_lease_take()). */
  ENCACHE_STORE_CAP_LEASE = 1u << 6,
  /* Added in 1.3: a read of a missing key answers ENCACHE_ENOENT for that
   * key and costs no more than an existence check (a remote Store's
   * round trip): a lookup then reads without checking existence first
   * (except for objects larger than its staging buffer, and with single
   * flight on), with the same outcomes. */
  ENCACHE_STORE_CAP_READ_ABSENT = 1u << 7,
  /* Added in 1.3: a call waits for its transfer by polling, a whole CPU
   * per call in flight (Mooncake's client as built by default): the
   * publisher keeps one write in flight, not two, unless the option
   * store_writes_in_flight says how many. */
  ENCACHE_STORE_CAP_BUSY_WAIT = 1u << 8
} encache_store_caps;

typedef struct encache_store_backend {
  size_t size;      /* sizeof(encache_store_backend): set it first */
  unsigned version; /* ENCACHE_STORE_BACKEND_VERSION */
  const char *kind; /* a short name, e.g. "shm"; static storage */
  unsigned caps;    /* encache_store_caps */
  /* As encache_store_exists(), encache_store_read(), ... */
  int (*exists)(encache_store *st, const char *const *keys, size_t n,
                int *results);
  int (*read)(encache_store *st, const char *const *keys, size_t n,
              void *const *bufs, const size_t *caps, int64_t *results);
  /* ENCACHE_STORE_CAP_READ_SPLIT: read() that splits each object, its
   * first `split` bytes to heads[i] and the rest to bufs[i] (capacity
   * caps[i]); results[i] counts the whole object, and one longer than
   * split + caps[i] is ENCACHE_ETOOLARGE. */
  int (*read_split)(encache_store *st, const char *const *keys, size_t n,
                    size_t split, void *const *heads, void *const *bufs,
                    const size_t *caps, int64_t *results);
  int (*object_size)(encache_store *st, const char *key, uint64_t *len);
  int (*write)(encache_store *st, const char *key, const void *hdr,
               size_t hdr_len, const void *payload, size_t len);
  int (*remove)(encache_store *st, const char *key);
  /* ENCACHE_STORE_CAP_REGISTER: make [buf, buf+len) usable; undo it. */
  int (*register_buffer)(encache_store *st, void *buf, size_t len);
  int (*unregister_buffer)(encache_store *st, void *buf);
  /* ENCACHE_STORE_CAP_LIST. */
  int (*list)(encache_store *st, const char *pattern,
              int (*cb)(const char *key, uint64_t len, void *arg), void *arg);
  /* Fill what you know; the rest stays UINT64_MAX (kind is set). */
  int (*stats)(encache_store *st, encache_store_stats *stats);
  /* Release everything, the handle included (encache_store_free()). */
  void (*close)(encache_store *st);
  /* Added in 1.2 (a table of the 1.0 size ends above; size says which
   * one a backend was built with).  ENCACHE_STORE_CAP_REMOVE_PREFIX: as
   * encache_store_remove_prefix(): removes every object whose key starts
   * with prefix (bytes, no pattern), their count in *removed (never
   * NULL), nothing else ever. */
  int (*remove_prefix)(encache_store *st, const char *prefix,
                       uint64_t *removed);
  /* Added in 1.2.  ENCACHE_STORE_CAP_LEASE: as encache_store_lease_take()
   * and encache_store_lease_drop() (token is never 0). */
  int (*lease_take)(encache_store *st, const char *key, uint64_t token,
                    uint32_t ttl_ms);
  int (*lease_drop)(encache_store *st, const char *key, uint64_t token);
  /* Added in 1.3: a request the other operations do not make, by code (as
   * SQLite's xFileControl): op is one of encache_store_control_op, arg
   * its argument.  Called with arg NULL it does nothing and answers 0 when
   * the backend knows op (the library asks so once, at open).  A backend
   * that does not know op does nothing and answers
   * ENCACHE_STORE_CONTROL_UNKNOWN; so does a backend without control (NULL,
   * or a table that ends before it): every caller takes that answer as
   * "not supported" and goes its ordinary way.  Any other answer is the
   * request's (0, or a code listed at encache_store). */
  int (*control)(encache_store *st, int op, void *arg);
} encache_store_backend;

/* Added in 1.3: what control answers for a request it does not know
 * (nothing was done).  Not a code of the error table: never negative. */
#define ENCACHE_STORE_CONTROL_UNKNOWN 1

/* Added in 1.3: the requests of encache_store_backend.control.  The codes
 * from 65536 on are the built-in backends' own: a backend of yours does
 * not know them. */
typedef enum encache_store_control_op {
  /* arg: an encache_store_write_known.  write() of a key whose existence
   * is known already: the publisher asked exists() ahead, for several
   * queued keys in one call, of a backend whose write would otherwise ask
   * it first for each key (Mooncake's does).  A backend that knows it
   * answers as write() does (ENCACHE_EEXIST when present is 1). */
  ENCACHE_STORE_CONTROL_WRITE_KNOWN = 1
} encache_store_control_op;

/* Added in 1.3: the argument of ENCACHE_STORE_CONTROL_WRITE_KNOWN. */
typedef struct encache_store_write_known {
  size_t size; /* sizeof(encache_store_write_known) */
  const char *key;
  const void *hdr;
  size_t hdr_len;
  const void *payload;
  size_t len;
  int present; /* the exists() answer for key: 1 present, else not known
                * present (0, or the failed check's code) */
} encache_store_write_known;

/*
 * Makes a handle for backend b (which must outlive it) with your data and
 * the URL to show (its password, if any, is never shown; NULL = kind
 * ":").  Checks b: its size (at least 1.0's: a table built against an
 * earlier header has none of the operations added since) and version,
 * the required operations, and that caps and the optional operations
 * agree (ENCACHE_EINVAL, with encache_store_errmsg(NULL) naming what is
 * wrong).  Errors also ENCACHE_ENOMEM.
 */
ENCACHE_EXTERN int encache_store_new(const encache_store_backend *b,
                                     void *data, const char *url,
                                     encache_store **out);
/* Frees a handle made by encache_store_new() (from your close). */
ENCACHE_EXTERN void encache_store_free(encache_store *st);
/* The data given to encache_store_new(). */
ENCACHE_EXTERN void *encache_store_data(const encache_store *st);
/* The capabilities of a handle's backend (encache_store_caps). */
ENCACHE_EXTERN unsigned encache_store_caps_of(const encache_store *st);
/* Records why the calling thread's call on st failed (printf format) and
 * returns rc, for `return encache_store_fail(st, ENCACHE_EUNAVAIL, ...)`. */
ENCACHE_EXTERN int encache_store_fail(encache_store *st, int rc,
                                      const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Opens a handle for `url` (which starts with the registered scheme and
 * "://" or ":"); arg is what was registered.  On failure returns a
 * negative code with *out NULL, after encache_store_fail(NULL, ...). */
typedef int (*encache_store_open_fn)(const char *url, void *arg,
                                     encache_store **out);

/*
 * Registers `open` for URLs "SCHEME://..." and "SCHEME:...".  A scheme is
 * letters, digits, '+', '-', '.' (RFC 3986), at most 31 bytes; the
 * built-in schemes and one already registered are refused
 * (ENCACHE_EEXIST); at most 16 schemes (ENCACHE_ENOBUFS).  Thread safe.
 */
ENCACHE_EXTERN int encache_store_register(const char *scheme,
                                          encache_store_open_fn open,
                                          void *arg);

/* Removes the shared-memory segment NAME (as in shm://NAME).  Processes
 * that have it open keep their mapping until they close it.  Errors:
 * ENCACHE_ENOENT, ENCACHE_EURL (bad name), -errno. */
ENCACHE_EXTERN int encache_shm_destroy(const char *name);

/* ----------------------------------------------------------------- engine */

/*
 * The engine: what an encoder calls on every step (docs/engine.md).
 *
 *   encache_open()        once, from the vLLM ec-transfer-config JSON (or
 *                         a typed encache_config)
 *   encache_step_open()   per encoder step: the step's candidate set
 *   encache_lookup()      before encoding: which candidates are already in
 *                         the Store; their outputs are loaded into
 *                         destinations the caller's allocator hands out;
 *                         the eligible candidates join the step
 *   encache_publish()     after encoding: queue each new output of one of
 *                         the step's candidates for a background write
 *                         (bounded, best effort)
 *   encache_step_close()  when the step's outputs are published
 *   encache_close()       drain the queue, close the Store
 *
 * Steps: a publication names the step it belongs to and is accepted only
 * for that step's candidates, so a pipelined server may look up step N+1
 * before it publishes step N.  At most ENCACHE_MAX_STEPS steps are open at
 * once on a handle (ENCACHE_ESTEPS beyond); a step's pointer is valid
 * until encache_step_close() or encache_close(), which closes the steps
 * still open.
 *
 * Threading: the calls on one handle and its steps (step open and close,
 * lookup, publish, flush, close) must not run at the same time (an encoder
 * step is one thread; serialise them if not).  The publisher's worker
 * thread is internal: it only writes to the Store.  The lookup threads
 * (1.3) run started lookups and take turns with those calls, but for
 * their Store calls (encache_lookup_start()).  encache_stats_get()
 * may be called from any thread; encache_errmsg(ec) from the thread that
 * makes the calls (its message changes with each of them).  Caller callbacks
 * (allocator, storage release) always run on the thread that called
 * lookup, publish, flush or close, never on the worker; for a started
 * lookup (1.3), on a lookup thread.
 *
 * Caller-allocated structs (options, candidates, results, allocator,
 * stats, tensors) start with `size_t size`: set it to sizeof the struct (the
 * ENCACHE_*_INIT initialisers do, e.g.
 * `encache_options o = ENCACHE_OPTIONS_INIT;`, or `= {.size = sizeof o}`).
 * A size below API 1.0's is refused (ENCACHE_EINVAL); a larger one
 * (a newer header) is accepted when the fields this library does not
 * know are zero.  Arrays are strided by their first element's size.
 *
 * Errors: every handle owns its last message (encache_errmsg()); a failed
 * encache_open() returns no handle and leaves its message in the calling
 * thread's encache_errmsg(NULL).  Messages live in fixed buffers: recording
 * one never allocates, so none is lost to an out-of-memory condition.
 *
 * Poisoning: when a Store operation's completion cannot be confirmed, the
 * Store may still write into memory encache handed it.  The handle is
 * then poisoned: those buffers are deliberately never freed or reused,
 * every later call fails fast with ENCACHE_EPOISONED, and close reports it.
 * The process is expected to exit.
 */
typedef struct encache encache;
typedef struct encache_step encache_step;

/* The most steps open at once on one handle. */
#define ENCACHE_MAX_STEPS 64

/* Where a destination (or a published output) lives.  CUDA (added in
 * 1.3) needs the CUDA runtime, loaded at run time ($ENCACHE_CUDA_LIBRARY,
 * else libcudart.so): without it a CUDA candidate is SKIPPED with the
 * reason in its why; any other kind is SKIPPED. */
typedef enum encache_device_kind {
  ENCACHE_DEVICE_HOST = 0,
  ENCACHE_DEVICE_CUDA = 1
} encache_device_kind;

typedef enum encache_modality {
  ENCACHE_MODALITY_IMAGE = 0, /* the only modality looked up and published */
  ENCACHE_MODALITY_VIDEO = 1,
  ENCACHE_MODALITY_AUDIO = 2
} encache_modality;

typedef struct encache_options {
  size_t size; /* sizeof(encache_options): set it first */
  /* The producer's vLLM --ec-transfer-config, the whole JSON object
   * (required unless `config` is set).  len 0 = strlen. */
  const char *ec_transfer_config;
  size_t ec_transfer_config_len;
  /* Typed options instead of the JSON: a configuration the caller filled
   * (by its setters or a load); ec_transfer_config must then be NULL.
   * Run encache_config_validate() on one built with the setters first:
   * encache_open() takes the values as they are.
   * Read during encache_open() only (which may record a message in it,
   * encache_config_errmsg()); the caller keeps and frees it. */
  const encache_config *config;
  /* The namespace (docs/format.md): the model path as given to the
   * encoder (used when embedding_model_identity is unset; required), the
   * revision and multimodal-config hash (NULL = none), the model dtype. */
  const char *model;
  const char *revision;
  const char *encoder_hash;
  int model_dtype;
  /* The Store (NULL = $ENCACHE_STORE, else ENCACHE_DEFAULT_STORE). */
  const char *store_url;
  /* How the encoder runs (NULL = vLLM's defaults); reuse is refused when
   * it cannot be correct (see encache_config_check_deployment()). */
  const encache_deployment *deployment;
  /* Optional: warnings (an object too large for the staging buffer, with
   * both sizes; a publication the Store failed to write, with the Store's
   * reason) go here; called on the caller's thread.  NULL = none. */
  void (*log)(void *ctx, const char *message);
  void *log_ctx;
} encache_options;

#define ENCACHE_OPTIONS_INIT {.size = sizeof(encache_options)}

/*
 * Opens a handle.  With cross_encoder_cache false, the handle is a no-op:
 * no Store is opened, no thread started; steps open, lookups answer
 * SKIPPED and publications are skipped (ENCACHE_SKIP_DISABLED).
 * On failure *out is NULL and encache_errmsg(NULL), on the calling thread,
 * says why.  Errors: ENCACHE_EINVAL (no options, a bad size, both or
 * neither of ec_transfer_config and config), ENCACHE_EJSON,
 * ENCACHE_ECONFIG (the message names the field), ENCACHE_EURL,
 * ENCACHE_EFORMAT, ENCACHE_ENOMEM, -errno.
 */
ENCACHE_EXTERN int encache_open(const encache_options *opts, encache **out);

/*
 * Shuts down: waits for the started lookup that is running (1.3; those
 * queued never run), closes the steps still open (their pointers die with
 * the handle), refuses later publications, waits for the queued writes (no
 * cancellation), releases them, unregisters and frees the staging buffer,
 * closes the Store exactly once, frees the handle.  NULL is a no-op.
 * Returns 0, or ENCACHE_EPOISONED when the handle was poisoned: then the
 * buffers the Store may still touch (and the Store) are left alone.
 */
ENCACHE_EXTERN int encache_close(encache *ec);

/* Detail of the handle's last failure (lookup, publish, step, flush,
 * close), "" when none.  Valid until the next call on the handle.  With ec
 * NULL: the message of the calling thread's last failed encache_open()
 * (thread-local storage, valid until that thread's next open), or of its
 * last failed encache_model_identity() (added in 1.2), whichever
 * failed last.  Never NULL. */
ENCACHE_EXTERN const char *encache_errmsg(const encache *ec);

/* 1 when cross_encoder_cache is on (the handle uses a Store), else 0. */
ENCACHE_EXTERN int encache_enabled(const encache *ec);

/* The handle's namespace (keys are NAMESPACE "@id:" ID).  Owned by ec. */
ENCACHE_EXTERN const char *encache_namespace_of(const encache *ec);

/*
 * Opens a step of ec in *out: an empty candidate set that lookups fill and
 * publications consult.  Errors: ENCACHE_ESTEPS (ENCACHE_MAX_STEPS are
 * open: close one), ENCACHE_EPOISONED, ENCACHE_ENOMEM, ENCACHE_EINVAL;
 * *out is NULL on failure.
 */
ENCACHE_EXTERN int encache_step_open(encache *ec, encache_step **out);

/*
 * Added in 1.3.  The CUDA stream (a cudaStream_t) on which the step's
 * lookups copy hits into CUDA destinations; NULL (the default) = a stream
 * the handle owns for the destination's device, created on first use
 * (blocking: ordered after the legacy default stream's work only).
 * Destinations from a stream-ordered allocator (torch's caching
 * allocator, cudaMallocAsync) need their allocation stream here.
 * The stream must belong to the device of the step's CUDA candidates.  A
 * lookup returns once its copies are complete, so that the caller may use
 * the destinations on any stream.  Caller's thread, like the step.
 * Errors: ENCACHE_EINVAL (step NULL).
 */
ENCACHE_EXTERN int encache_step_set_stream(encache_step *step, void *stream);

/* Closes a step: releases its candidate set (publications already queued
 * are not affected).  NULL is a no-op.  Since 1.3, a lookup started on it
 * (encache_lookup_start()) that is running is waited for: its hits are
 * the caller's, as a completed encache_lookup()'s; one still queued never
 * runs (nothing allocated, results untouched).  Its fd is closed. */
ENCACHE_EXTERN void encache_step_close(encache_step *step);

/* One input of a step, as the caller describes it. */
/* Added in 1.3: the longest candidate id, in bytes.  vLLM's ids are
 * hashes (64 hex digits) or request UUIDs; a longer one is SKIPPED with
 * the reason, whatever the Store's own key limit (shm's is 64 KiB). */
#define ENCACHE_MAX_ID_LEN 8192

typedef struct encache_candidate {
  size_t size;          /* sizeof(encache_candidate): set it first */
  const char *id;       /* mm_hash or caller UUID; the key's identifier
                           (1 to ENCACHE_MAX_ID_LEN bytes, else SKIPPED) */
  int modality;         /* encache_modality */
  int dtype;            /* expected output: encache_dtype, rows x cols */
  uint64_t rows;
  uint64_t cols;
  int device;           /* encache_device_kind of the destination */
  int device_index;
} encache_candidate;

#define ENCACHE_CANDIDATE_INIT {.size = sizeof(encache_candidate)}

/* The caller's allocator of destinations, so that outputs can be the
 * serving stack's own tensors. */
typedef struct encache_allocator {
  size_t size; /* sizeof(encache_allocator): set it first */
  void *ctx;
  /* Allocate nbytes for candidate i (on its device); set *data to the
   * destination and *handle to anything the caller wants back (its tensor).
   * c is the caller's own candidate i.  Return 0, or a negative code (the
   * lookup then fails with that code, and the handle stays healthy). */
  int (*alloc)(void *ctx, size_t i, const encache_candidate *c,
               uint64_t nbytes, void **data, void **handle);
  /* Release a destination that alloc returned but the lookup does not
   * hand back (its object turned out not to be a hit, or the lookup
   * failed).  May be NULL if nothing is needed. */
  void (*release)(void *ctx, size_t i, void *data, void *handle);
  /* Added in 1.3: how many bytes in front of every host destination
   * (data - headroom .. data) the lookup may overwrite; 0 (the default):
   * none.  With ENCACHE_HEADER_SIZE or more, a Store without split reads
   * that needs no registered memory (Mooncake over TCP, a tier in front
   * of it, a Store of your own without read_split) reads each object of
   * a lookup of 1 MiB or more (with no CUDA candidate and no empty
   * output) straight into its destination, its 24-byte header just in
   * front: no copy out of the staging buffer.  Those bytes then hold
   * anything.  CUDA destinations are never written outside
   * [data, data + nbytes). */
  size_t headroom;
} encache_allocator;

#define ENCACHE_ALLOCATOR_INIT {.size = sizeof(encache_allocator)}

typedef enum encache_outcome {
  ENCACHE_HIT = 0,          /* loaded into data; do not encode */
  ENCACHE_MISS = 1,         /* not in the Store */
  ENCACHE_INCOMPATIBLE = 2, /* an object is there but is not this output */
  ENCACHE_OVERSIZE = 3,     /* larger than store_read_buffer_bytes */
  ENCACHE_UNAVAILABLE = 4,  /* the Store failed, recoverably */
  ENCACHE_SKIPPED = 5,      /* not eligible (modality, dtype, device, ...) */
  /* Added in 1.2, only with single_flight on: another encoder holds the
   * key's lease (it is encoding it) and its output did not come within
   * single_flight_wait_ms; or this handle holds leases it has not
   * published (it never waits then: docs/engine.md, "Single flight").
   * Encode it, or (better) publish your own misses, then look it up again
   * on the same step: that lookup waits. */
  ENCACHE_IN_FLIGHT = 6
} encache_outcome;

/* "HIT", "MISS", "INCOMPATIBLE", "OVERSIZE", "UNAVAILABLE", "SKIPPED",
 * "IN_FLIGHT". */
ENCACHE_EXTERN const char *encache_outcome_name(int outcome);

typedef struct encache_result {
  size_t size;         /* sizeof(encache_result): set it in results[0] */
  int outcome;         /* encache_outcome */
  int verdict;         /* INCOMPATIBLE: the encache_verdict (what differed) */
  encache_header found;/* INCOMPATIBLE: the header found (zeroed if short) */
  void *data;          /* HIT: the destination, filled */
  void *handle;        /* HIT: what alloc returned with it */
  uint64_t nbytes;     /* HIT: payload bytes */
  /* Added in 1.1.  Why the outcome is not a HIT, in words, NULL for a HIT:
   * MISS "not in the Store"; INCOMPATIBLE what differed ("shape 2x2
   * (expected 4x1)"); OVERSIZE both sizes and the option to raise;
   * UNAVAILABLE the Store's own message ("the existence check failed:
   * ...: AUTH: WRONGPASS ...", "...: Connection refused"); SKIPPED the
   * rule that made the candidate ineligible.  Owned by the step: valid
   * until encache_step_close() (or encache_close()).  A caller compiled
   * against 1.0 has no such field, and none is written for it. */
  const char *why;
} encache_result;

#define ENCACHE_RESULT_INIT {.size = sizeof(encache_result)}

/*
 * Looks up candidates c[0..n) for step and fills results[0..n); the
 * eligible candidates join the step (several lookups on one step add to
 * it).  Every candidate's size is c[0].size; results[0].size is read and
 * every result is written with it.  Every HIT's destination comes from
 * the allocator and belongs to the caller; all other outcomes mean
 * "encode it".  Duplicate ids are read once (each gets its own
 * destination).  Returns the number of hits, or a negative code: the
 * allocator's error (every destination already allocated was released;
 * the handle stays healthy), ENCACHE_EPOISONED (now or before),
 * ENCACHE_ENOMEM (every destination was released; the handle stays
 * healthy), ENCACHE_EINVAL (a NULL or a struct of a bad size; the
 * handle's message says which).
 */
ENCACHE_EXTERN int encache_lookup(encache_step *step,
                                  const encache_candidate *c, size_t n,
                                  const encache_allocator *alloc,
                                  encache_result *results);

/*
 * Added in 1.3: lookups that do not wait (docs/engine.md, "Lookups that
 * do not wait").  encache_lookup_start() checks its arguments and returns
 * at once; the same lookup as encache_lookup() then runs on one of the
 * handle's lookup threads (store_reads_in_flight of them, started by the
 * first start, joined by encache_close()), and encache_step_wait() gives
 * what encache_lookup() would have returned, results[] filled.
 *
 * Lifetime: c[0..n) (and the ids they point to) and results[0..n) are the
 * caller's and must stay valid and untouched until the lookup completes
 * (encache_step_wait() returned something else than ENCACHE_EPENDING, or
 * the step was closed); *alloc is copied, but its ctx and callbacks must
 * stay usable as long.  The allocator's callbacks run on a lookup
 * thread, or on the thread of a wait without a bound (below): make them
 * thread-safe.
 *
 * Serialisation: the lookup uses the handle's caller-thread state, so
 * the calls on its handle and steps (encache_lookup, encache_publish,
 * encache_flush, encache_step_open, encache_step_close,
 * encache_step_set_stream, encache_close; and encache_lookup_start when
 * its arguments are bad, to record the message) take turns with it,
 * except while it is in a Store call (its existence check, its reads):
 * then they go on, and the lookups of other steps too, up to
 * store_reads_in_flight of them reading the Store at once.  A call on
 * the step of a lookup that is reading (encache_lookup, encache_publish,
 * encache_step_set_stream, encache_step_close) waits until it completes.
 * Lookups into CUDA destinations keep their turn throughout, as do the
 * single-flight phase's Store calls.  A start with good arguments never
 * waits: it queues the lookup.  encache_step_fd() and encache_step_wait()
 * with a bound (timeout_ms >= 0) never wait for the handle (a wait
 * without a bound may run the lookup itself, taking its turn, when no
 * other lookup of the handle is started), and may be called from another
 * thread than the one that started the lookup (not at the same time as
 * encache_step_close() of that step).  Lookups started on several steps
 * begin in the order they were started.
 *
 * Returns 0 (started), or at once what encache_lookup() returns for bad
 * arguments before any Store call: ENCACHE_EINVAL (step NULL, c or results
 * NULL with n > 0, results[0].size, no allocator; or a lookup already
 * started on this step and not yet waited for: refused at once, the
 * handle's message unchanged), ENCACHE_EPOISONED,
 * ENCACHE_ENOMEM or -errno (the lookup thread cannot start).  Any other
 * failure is reported by encache_step_wait().
 */
ENCACHE_EXTERN int encache_lookup_start(encache_step *step,
                                        const encache_candidate *c, size_t n,
                                        const encache_allocator *alloc,
                                        encache_result *results);

/*
 * Added in 1.3.  Waits at most timeout_ms (-1: without a bound, 0: a poll)
 * for the step's started lookup.  Returns ENCACHE_EPENDING while it has not
 * completed; once it has, exactly what encache_lookup() would have
 * returned for it (the hit count, or a negative code: ENCACHE_EPOISONED
 * when one of its reads was unconfirmed), and the lookup is then done
 * with: a second wait returns ENCACHE_EINVAL, as does a wait on a step
 * with no lookup started.  Consumes the step's fd readiness
 * (encache_step_fd()).  Any thread (see encache_lookup_start()).
 */
ENCACHE_EXTERN int encache_step_wait(encache_step *step, int timeout_ms);

/*
 * Added in 1.3.  A file descriptor (an eventfd, non-blocking, close on
 * exec) that becomes readable once when the step's started lookup
 * completes, for poll(), epoll or an event loop (asyncio's add_reader);
 * encache_step_wait() consumes the readiness (read nothing from it
 * yourself).  Made on the first call, the same one after; owned by the
 * step (closed by encache_step_close(): remove it from your loop first).
 * Returns the descriptor, or ENCACHE_EINVAL (step NULL), -errno.
 */
ENCACHE_EXTERN int encache_step_fd(encache_step *step);

/*
 * A reference-counted backing storage of outputs (a tensor's storage):
 * bytes [base, base + nbytes), released by calling release(ctx) when the
 * last reference goes.  The caller holds one reference from
 * encache_storage_new() and drops it with encache_storage_unref(); each
 * queued publication holds another until it is reaped, so the memory is
 * never reused while a write may still read it.
 */
typedef struct encache_storage encache_storage;

ENCACHE_EXTERN int encache_storage_new(const void *base, uint64_t nbytes,
                                       void (*release)(void *ctx), void *ctx,
                                       encache_storage **out);
ENCACHE_EXTERN void encache_storage_unref(encache_storage *s);
/* Added in 1.2.  Takes another reference to s, dropped with
 * encache_storage_unref().  The caller must know that a reference is held
 * and cannot be dropped meanwhile (its own, or a queued publication's
 * while no call that reaps runs on the handle: the reaps are on the
 * caller's thread, so a caller that serialises its calls knows).  This
 * lets a binding find the storage of memory it already published and
 * charge the budgets once for all its views.  NULL is a no-op. */
ENCACHE_EXTERN void encache_storage_ref(encache_storage *s);

/* Why a publication was skipped (encache_publish() returns these > 0). */
#define ENCACHE_SKIP_MAP(XX)                                                 \
  XX(DISABLED, 1, "cross_encoder_cache is off")                              \
  XX(NOT_CANDIDATE, 2, "not a candidate of the step")                        \
  XX(NOT_MATRIX, 3, "not a 2-D matrix")                                      \
  XX(NOT_CONTIGUOUS, 4, "not contiguous")                                    \
  XX(DTYPE, 5, "dtype not float32/float16/bfloat16")                         \
  XX(OUTSIDE_STORAGE, 6, "view outside its backing storage")                 \
  XX(PENDING, 7, "already pending under the same key")                       \
  XX(CLOSED, 8, "publisher closed")                                          \
  XX(OVER_ITEMS, 9, "store_max_pending_items reached")                       \
  XX(OVER_BYTES, 10, "store_max_pending_bytes reached")                      \
  XX(MISMATCH, 11, "not the candidate's dtype and shape")

/* ENCACHE_SKIP_COUNT_ is the size of encache_stats.published_skipped,
 * frozen with the 1.0 ABI; reasons added since (MISMATCH, added in 1.3)
 * are counted in fields of their own.  ENCACHE_SKIP_REASONS_ is one more
 * than the highest reason: loop to it with encache_stats_skipped(). */
typedef enum encache_skip {
  ENCACHE_QUEUED = 0,
#define ENCACHE_SKIP_ENUM_(name, value, msg) ENCACHE_SKIP_##name = (value),
  ENCACHE_SKIP_MAP(ENCACHE_SKIP_ENUM_)
#undef ENCACHE_SKIP_ENUM_
  ENCACHE_SKIP_COUNT_ = 11,
  ENCACHE_SKIP_REASONS_ = 12
} encache_skip;

/* "queued", or the reason's message. */
ENCACHE_EXTERN const char *encache_skip_name(int reason);

/*
 * Queues the output `view` (a 2-D, row-major, contiguous matrix inside
 * `storage`) for publication under `id`, which must be an eligible
 * candidate of a lookup on `step` (else ENCACHE_SKIP_NOT_CANDIDATE), and
 * be that candidate's output: its dtype, rows and cols (else, added in
 * 1.3, ENCACHE_SKIP_MISMATCH: written, it would be INCOMPATIBLE to every
 * reader, and never replaced).  An id looked up under two contracts takes
 * either output.  Nothing is copied here: the worker writes straight from the storage,
 * which stays retained until the job is reaped.  Returns ENCACHE_QUEUED
 * (0), a skip reason (> 0; the storage is not retained), or a negative
 * code: ENCACHE_EPOISONED, ENCACHE_EINVAL, ENCACHE_ENOMEM.
 *
 * Added in 1.3, a CUDA output (view->device ENCACHE_DEVICE_CUDA; storage
 * and data are device addresses): on the caller's thread, without
 * waiting, its bytes are copied into a page-locked buffer of a bounded
 * pool (device_pinned_pool_bytes) by a copy queued on view->stream, then
 * an event is recorded there; the worker waits for the event (at most
 * device_sync_timeout_ms, else the handle is poisoned) and writes the
 * buffer.  So the bytes written are the tensor's as of the publish call in
 * the stream's order: the caller may go on writing it on that stream.
 * Budgets charge the device storage as a host one.  No room in the pool:
 * ENCACHE_SKIP_OVER_BYTES (stats: device_pool_full).  No CUDA runtime or
 * no device: ENCACHE_ENOLIB, the handle's message saying why; a
 * device_index the runtime does not have: ENCACHE_EINVAL; a copy or
 * an event the runtime refuses: ENCACHE_EIO (nothing queued); an event
 * that cannot be recorded after the copy was queued: ENCACHE_EPOISONED.
 */
ENCACHE_EXTERN int encache_publish(encache_step *step, const char *id,
                                   const encache_tensor *view,
                                   encache_storage *storage);

/* Waits until every queued publication has been written or skipped, then
 * reaps them.  Returns 0 or ENCACHE_EPOISONED. */
ENCACHE_EXTERN int encache_flush(encache *ec);

typedef struct encache_stats {
  size_t size;                 /* sizeof(encache_stats): set it first */
  uint64_t lookups;            /* lookup calls */
  uint64_t candidates;         /* candidates looked at */
  uint64_t hits;
  uint64_t misses;             /* MISS */
  uint64_t incompatible;       /* INCOMPATIBLE */
  uint64_t oversize;           /* OVERSIZE */
  uint64_t unavailable;        /* UNAVAILABLE */
  uint64_t skipped;            /* SKIPPED */
  uint64_t bytes_read;         /* payload bytes loaded into destinations */
  uint64_t batched_reads;      /* Store read calls (one per chunk) */
  uint64_t published_queued;
  uint64_t published_written;  /* written to the Store */
  uint64_t published_present;  /* already in the Store: nothing written */
  uint64_t published_failed;   /* recoverable Store failures: not written */
  uint64_t published_skipped[ENCACHE_SKIP_COUNT_]; /* by reason */
  uint64_t pending_items;      /* queued or in flight, not yet reaped */
  uint64_t pending_bytes;      /* charged bytes (per backing storage) */
  uint64_t staging_allocations;/* staging buffers allocated (1.3: the
                                * handle's and its lookup threads') */
  uint64_t staging_bytes;      /* their current size (0 = none) */
  uint64_t steps_open;         /* steps open now (at most ENCACHE_MAX_STEPS) */
  int poisoned;
  /* Added in 1.2: single flight (all 0 when it is off). */
  uint64_t in_flight;          /* IN_FLIGHT outcomes */
  uint64_t leases_taken;       /* misses this handle took the lease of */
  uint64_t leases_failed;      /* lease calls the Store failed: plain misses */
  uint64_t waited;             /* candidates that waited for another's output */
  uint64_t waited_hits;        /* ... and became HITs */
  uint64_t wait_us;            /* time lookups spent waiting, microseconds */
  /* Added in 1.3: CUDA devices (docs/engine.md, "Device outputs"). */
  uint64_t device_bytes_copied; /* payload bytes copied to CUDA destinations */
  uint64_t device_published;    /* publications of CUDA outputs queued */
  uint64_t device_pool_bytes;   /* page-locked pool memory allocated now */
  uint64_t device_pool_full;    /* CUDA publications skipped: pool full */
  /* Added in 1.3: publications skipped as ENCACHE_SKIP_MISMATCH (an
   * output whose dtype, rows or cols are not the candidate's). */
  uint64_t published_mismatch;
  /* Added in 1.3: objects the Store served this handle without a check
   * that vouched for their bytes (a Redis Store under checksum=on, the
   * default, or off: objects written without one, by an older encache or
   * with checksum=off, or whose check a server hid; docs/stores.md,
   * "Integrity").  Counted as the Store serves them (one then found
   * INCOMPATIBLE counts too); 0 on other Stores.  When it should stay 0,
   * checksum=required makes such objects misses. */
  uint64_t hits_unchecked;
} encache_stats;

#define ENCACHE_STATS_INIT {.size = sizeof(encache_stats)}

/* Added in 1.3.  The count of publications skipped for `reason` (1 to
 * ENCACHE_SKIP_REASONS_ - 1) in *st, whichever field holds it; 0 for
 * anything else, or a reason st->size has no room for. */
ENCACHE_EXTERN uint64_t encache_stats_skipped(const encache_stats *st,
                                              int reason);

/* Fills *st (st->size set by the caller).  Errors: ENCACHE_EINVAL. */
ENCACHE_EXTERN int encache_stats_get(const encache *ec, encache_stats *st);

/* Added in 1.3: the counters of the Store the engine opened, as
 * encache_store_stats_get() gives them (a tier: Store's per-tier counters
 * are then this engine's: hits of the local and the remote tier,
 * promotions).  Any thread.  Errors: ENCACHE_EINVAL (ec or st NULL, a bad
 * st->size, or a disabled handle, which has no Store), the Store's (such
 * as ENCACHE_EUNAVAIL when a tier's local lock is held); the calling
 * thread's encache_errmsg(NULL) says why (ec's own message belongs to the
 * thread that makes its calls, so this call leaves it alone). */
ENCACHE_EXTERN int encache_engine_store_stats(const encache *ec,
                                              encache_store_stats *st);

/* ------------------------------------------------------ model identity */

/*
 * Added in 1.2.  An identity string for `embedding_model_identity`
 * that follows a model's weights: new weights under the same model name
 * give a new identity, hence a new namespace, so that embeddings of the
 * old weights simply stop matching (docs/deploy.md, "Weights that
 * change").  The identity reads
 *
 *     LABEL "@weights:xxh128:" HEX
 *
 * HEX being 32 lower-case hex digits, e.g.
 * "Qwen2-VL-7B@weights:xxh128:6f1c...".  LABEL is 1 to
 * ENCACHE_IDENTITY_LABEL_MAX bytes of letters, digits and '.', '_', '-',
 * '/' (no '@' or ':'; nothing a shell or a Redis SCAN pattern reads
 * specially; only '.' means more in a regular expression); NULL or "" = the
 * name of the directory (its real path's last component) with every
 * other character replaced by '_', cut to the maximum ("model" for "/").
 *
 * Which files count: regular files (or symbolic links to them, as in a
 * Hugging Face cache snapshot) whose names end in ".safetensors", ".bin",
 * ".pt" or ".pth", in model_dir and its subdirectories at any depth up to
 * 32.  Not counted: every other file (config.json, the *.index.json of
 * sharded weights, tokenizers: a save rewrites configs with version
 * fields while the weights stay the same), names starting with '.' (a
 * writer's temporary file, .git, .cache) and directories reached through
 * symbolic links.  A change of configuration that changes the outputs
 * needs a new LABEL.
 *
 * The digest: each file's content is hashed with XXH3-128 (xxHash),
 * streamed in 128 KiB reads; then one XXH3-128 over a manifest: the line
 * "encache-weights-v1\n", then for each file, sorted by relative path
 * (bytewise), the path's length (little-endian 64-bit), the path ('/'
 * between directories), the size (little-endian 64-bit) and the content
 * digest (XXH128's canonical 16 bytes, as xxhsum -H2 prints them); HEX is
 * that manifest digest's canonical form.  So
 * the identity does not depend on the order files were created in or the
 * directory lists them, and changes when a byte of a weight file changes
 * or a weight file is renamed, added, removed or truncated.  A file whose
 * size or modification time changes while it is read is refused (-EAGAIN):
 * compute the identity after the writer has finished.
 *
 * Writes the identity and a NUL into buf[0..size) and, when info is not
 * NULL (info->size set), the files and bytes hashed into *info.  Returns
 * the identity's length.  Errors (the calling thread's encache_errmsg(NULL)
 * names the path or the label at fault): ENCACHE_EINVAL (model_dir NULL or
 * empty, a bad label, a bad info->size), ENCACHE_ENOBUFS (size too small,
 * found before any file is read: ENCACHE_MODEL_IDENTITY_MAX always
 * suffices), ENCACHE_ENOENT (= -ENOENT: model_dir does not exist, or
 * holds no weight file; the message says which), -ENOTDIR, -EACCES,
 * -EIO ... (a directory or file that cannot be opened or read), -EAGAIN
 * (a file changed while it was read), -ELOOP (deeper than 32
 * directories), ENCACHE_ETOOLARGE (more than 100000 weight files),
 * ENCACHE_ENOMEM.  Only reads; may be called from any thread.
 */
#define ENCACHE_IDENTITY_LABEL_MAX 128
#define ENCACHE_MODEL_IDENTITY_MAX (ENCACHE_IDENTITY_LABEL_MAX + 16 + 32 + 1)

typedef struct encache_identity_info {
  size_t size;    /* sizeof(encache_identity_info): set it first */
  uint64_t files; /* weight files hashed */
  uint64_t bytes; /* their total size */
} encache_identity_info;

#define ENCACHE_IDENTITY_INFO_INIT {.size = sizeof(encache_identity_info)}

ENCACHE_EXTERN int encache_model_identity(const char *model_dir,
                                          const char *label, char *buf,
                                          size_t size,
                                          encache_identity_info *info);

/* ------------------------------------------------------ fleet statistics */

/*
 * Added in 1.3.  Every open handle (cross_encoder_cache on) publishes its
 * counters and two latency histograms in a host-local shared-memory
 * registry, the POSIX shared-memory object "/" + the stats_segment option
 * (default "encache.fleet.UID", UID the effective user id), so that tools read a whole host's encoders
 * without touching their processes (docs/engine.md, "Seeing the fleet").
 *
 * A histogram has fixed log-scale buckets: bucket[i], i <
 * ENCACHE_HISTOGRAM_BUCKETS - 1, counts the observations of at most
 * 2^i microseconds and more than the previous bound (not cumulative); the
 * last counts the longer ones.  sum_ns is their total in nanoseconds.
 */
#define ENCACHE_HISTOGRAM_BUCKETS 28

typedef struct encache_histogram {
  uint64_t count;
  uint64_t sum_ns;
  uint64_t bucket[ENCACHE_HISTOGRAM_BUCKETS];
} encache_histogram;

/* One live handle of the registry, filled by the library for a callback
 * (fields may be added at the end; size is this library's sizeof).  Every
 * pointer is valid during the callback only. */
typedef struct encache_fleet_entry {
  size_t size;
  int64_t pid;          /* the process that holds the handle */
  uint64_t start_time;  /* its start, clock ticks after boot (/proc) */
  const char *encoder;  /* the encoder_name option, else "PID@HOSTNAME" */
  const char *store;    /* the Store URL as encache_store_url() shows it */
  const char *ns;       /* the handle's namespace (may be cut at 255 bytes) */
  const encache_stats *stats;       /* as encache_stats_get() gives them */
  const encache_histogram *lookup;  /* encache_lookup() calls */
  const encache_histogram *write;   /* the publisher's Store writes */
  uint64_t bytes_written;           /* bytes written to the Store */
  uint32_t slot; /* its slot: unique among the live handles of the registry */
} encache_fleet_entry;

/*
 * Calls fn(entry, ctx) for each live handle of the registry `segment`
 * (NULL or "" = "encache.fleet.UID", UID the caller's effective user id),
 * in slot order, until fn returns non-zero.  Slots of processes that died
 * are skipped (the next encoder to open reuses them).  Returns the number of entries given to
 * fn.  Errors (the calling thread's encache_errmsg(NULL) says more):
 * ENCACHE_ENOENT (no such registry: no handle published since boot, or
 * every publisher used another), ENCACHE_EFORMAT (not a registry, a
 * damaged one, or one of another layout version), ENCACHE_EURL (a name
 * other than A-Z a-z 0-9 . _ -), -errno.  Any thread.
 */
typedef int (*encache_fleet_fn)(const encache_fleet_entry *entry, void *ctx);
ENCACHE_EXTERN int encache_fleet_read(const char *segment, encache_fleet_fn fn,
                                      void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* ENCACHE_H */
