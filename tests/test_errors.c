/* SPDX-License-Identifier: Apache-2.0 */
/* Error table, version and dtype helpers. */
#include "runner.h"

#include "encache.h"

TEST(errors_every_code_named) {
#define CHECK_(name, value, msg)                                             \
  ASSERT_EQ_STR(encache_err_name(ENCACHE_##name), #name);                    \
  ASSERT_EQ_STR(encache_strerror(ENCACHE_##name), msg);                      \
  ASSERT(ENCACHE_##name < 0);
  ENCACHE_ERRNO_MAP(CHECK_)
#undef CHECK_
  ASSERT_EQ_STR(encache_err_name(0), "OK");
  ASSERT_EQ_STR(encache_err_name(-30699), "UNKNOWN");
  ASSERT_EQ_STR(encache_strerror(-30699), "unknown error");
  ASSERT_EQ_STR(encache_strerror(12345), "unknown error");
  /* Other system errors get the C library's message. */
  ASSERT_EQ_STR(encache_strerror(-EACCES), strerror(EACCES));
}

TEST(errors_library_range_is_disjoint_from_errno) {
  ASSERT(ENCACHE_ECONFIG <= -30600 && ENCACHE_EURL > -30700);
  ASSERT_EQ_INT(ENCACHE_EINVAL, -EINVAL);
  ASSERT_EQ_INT(ENCACHE_ENOMEM, -ENOMEM);
}

TEST(version_matches_macros) {
  ASSERT_EQ_STR(encache_version(), ENCACHE_VERSION_STRING);
  ASSERT_EQ_INT(encache_version_number(), ENCACHE_VERSION_HEX);
  char buf[32];
  snprintf(buf, sizeof(buf), "%d.%d.%d", ENCACHE_VERSION_MAJOR,
           ENCACHE_VERSION_MINOR, ENCACHE_VERSION_PATCH);
  ASSERT_EQ_STR(buf, ENCACHE_VERSION_STRING);
}

TEST(dtype_names_sizes_parse) {
  ASSERT_EQ_INT(encache_dtype_size(ENCACHE_FLOAT32), 4);
  ASSERT_EQ_INT(encache_dtype_size(ENCACHE_FLOAT16), 2);
  ASSERT_EQ_INT(encache_dtype_size(ENCACHE_BFLOAT16), 2);
  ASSERT_EQ_INT(encache_dtype_size(1), 0);
  ASSERT(encache_dtype_name(5) == NULL);
  ASSERT_EQ_STR(encache_dtype_torch_name(ENCACHE_BFLOAT16), "torch.bfloat16");
  ASSERT_EQ_INT(encache_dtype_parse("float16"), ENCACHE_FLOAT16);
  ASSERT_EQ_INT(encache_dtype_parse("torch.bfloat16"), ENCACHE_BFLOAT16);
  ASSERT_EQ_INT(encache_dtype_parse("BF16"), ENCACHE_BFLOAT16);
  ASSERT_EQ_INT(encache_dtype_parse("fp32"), ENCACHE_FLOAT32);
  ASSERT_EQ_INT(encache_dtype_parse("int8"), ENCACHE_EDTYPE);
  ASSERT_EQ_INT(encache_dtype_parse("torch."), ENCACHE_EDTYPE);
  ASSERT_EQ_INT(encache_dtype_parse(NULL), ENCACHE_EDTYPE);
}
