/* The declared list of tests, in the order they run. */
#define TEST_LIST(XX)                                                        \
  XX(errors_every_code_named)                                                \
  XX(errors_library_range_is_disjoint_from_errno)                            \
  XX(version_matches_macros)                                                 \
  XX(dtype_names_sizes_parse)                                                \
  XX(keys_vector_prefixed)                                                   \
  XX(keys_vector_plain)                                                      \
  XX(keys_encoder_hash_and_dtypes)                                           \
  XX(keys_size_query_and_short_buffer)                                       \
  XX(keys_refuse_bad_input)                                                  \
  XX(keys_long_components_verbatim)                                          \
  XX(codec_normative_vector)                                                 \
  XX(codec_roundtrip_every_dtype)                                            \
  XX(codec_refuses_non_matrices)                                             \
  XX(codec_contiguity_as_pytorch)                                            \
  XX(codec_incompatible_objects)                                             \
  XX(codec_decode_is_endian_independent)                                     \
  XX(codec_describe)                                                         \
  XX(codec_payload_size_overflow)                                            \
  XX(config_defaults)                                                        \
  XX(config_reference_options_accepted)                                      \
  XX(config_bad_limits_name_the_option)                                      \
  XX(config_bad_types_name_the_option)                                       \
  XX(config_malformed_json_line_and_column)                                  \
  XX(config_failed_load_keeps_previous_values)                               \
  XX(config_deployment_rules)                                                \
  XX(config_mooncake_accepted)                                               \
  XX(config_mooncake_refusals_name_the_field)                                \
  XX(config_mooncake_file_and_env)                                           \
  XX(config_parse_size)                                                      \
  XX(config_out_of_memory_every_allocation)
