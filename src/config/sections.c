/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/sections.c: the rules between options of a section (required
 * options, ec_role with ec_connector, Mooncake's mode against its
 * segment) and the derived local hostname.
 */
#include "config/sections.h"
#include "config/python.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#define VAL(vals, id) (&(vals)[ENCACHE_OPT_##id])

/* vLLM's MooncakeStoreConfig.__post_init__: the mode decides the segment. */
static int mooncake_check(encache_config *cfg, const value *vals) {
  const value *mode = VAL(vals, MODE), *seg = VAL(vals, GLOBAL_SEGMENT_SIZE);
  int standalone = strcmp(mode->s, "standalone-store") == 0;
  if (!standalone && seg->u == 0)
    return encache__config_fail(
        cfg, ENCACHE_ECONFIG,
        "mooncake.global_segment_size: mode \"embedded\"%s needs a "
        "global_segment_size > 0, got 0 (vLLM refuses it too; a pure client "
        "is mode \"standalone-store\")",
        mode->given ? "" : " (the default mode)");
  if (standalone && seg->u != 0)
    return encache__config_fail(
        cfg, ENCACHE_ECONFIG,
        "mooncake.global_segment_size: mode \"standalone-store\" needs an "
        "explicit global_segment_size of 0, got %s (vLLM refuses it too)",
        seg->given ? seg->text : "none (default 4294967296)");
  return 0;
}

int encache__section_check(encache_config *cfg, const value *vals,
                           enum section sec) {
  for (int i = 0; i < NOPTS; i++)
    if (encache__opt_defs[i].sec == sec &&
        encache__opt_defs[i].rule == R_REQUIRED && !vals[i].set)
      return encache__config_fail(
          cfg, ENCACHE_ECONFIG, "%s.%s: required, but missing",
          encache__section_names[sec], encache__opt_defs[i].name);
  /* vLLM's ECTransferConfig.__post_init__: a connector needs a role. */
  if (sec == SEC_EC && VAL(vals, EC_CONNECTOR)->set && !VAL(vals, EC_ROLE)->set)
    return encache__config_fail(
        cfg, ENCACHE_ECONFIG,
        "ec_transfer_config.ec_role: required when ec_connector is set (one "
        "of ec_producer|ec_consumer|ec_both; vLLM refuses it too)");
  return sec == SEC_MOONCAKE ? mooncake_check(cfg, vals) : 0;
}

/* The address a UDP socket would send from to reach `addr` (nothing is
 * sent: connect() on a datagram socket only picks a route), or NULL. */
static char *outbound_address(int family, const void *addr, size_t alen) {
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return NULL;
  char text[INET6_ADDRSTRLEN] = "";
  struct sockaddr_storage local;
  socklen_t llen = sizeof(local);
  int ok = connect(fd, (const struct sockaddr *)addr, (socklen_t)alen) == 0 &&
           getsockname(fd, (struct sockaddr *)&local, &llen) == 0;
  close(fd);
  if (!ok)
    return NULL;
  const void *a =
      family == AF_INET
          ? (const void *)&((struct sockaddr_in *)&local)->sin_addr
          : (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr;
  if (inet_ntop(family, a, text, sizeof(text)) == NULL)
    return NULL;
  return encache__strdup(text);
}

/*
 * The local hostname a vLLM encoder gives Mooncake's setup(): vLLM does
 * not read local_hostname from the JSON; it takes
 * MOONCAKE_REQUESTER_LOCAL_HOSTNAME (stripped, when not blank), else
 * vllm.utils.network_utils.get_ip(): VLLM_HOST_IP when not empty, else the
 * source address of a UDP route to 8.8.8.8:80, else to
 * [2001:4860:4860::8888]:80, else "0.0.0.0".  Returns an allocation.
 */
static char *mooncake_local_hostname(void) {
  const char *o = getenv("MOONCAKE_REQUESTER_LOCAL_HOSTNAME");
  if (o != NULL) {
    const char *e = o + strlen(o);
    encache__py_strip(&o, &e);
    if (e > o) {
      char *r = encache__malloc((size_t)(e - o) + 1);
      if (r != NULL) {
        memcpy(r, o, (size_t)(e - o));
        r[e - o] = '\0';
      }
      return r;
    }
  }
  const char *ip = getenv("VLLM_HOST_IP");
  if (ip != NULL && ip[0] != '\0')
    return encache__strdup(ip);
  struct sockaddr_in v4;
  memset(&v4, 0, sizeof(v4));
  v4.sin_family = AF_INET;
  v4.sin_port = htons(80);
  inet_pton(AF_INET, "8.8.8.8", &v4.sin_addr);
  char *r = outbound_address(AF_INET, &v4, sizeof(v4));
  if (r != NULL)
    return r;
  struct sockaddr_in6 v6;
  memset(&v6, 0, sizeof(v6));
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(80);
  inet_pton(AF_INET6, "2001:4860:4860::8888", &v6.sin6_addr);
  r = outbound_address(AF_INET6, &v6, sizeof(v6));
  return r != NULL ? r : encache__strdup("0.0.0.0");
}

int encache__derive_hostname(encache_config *cfg, value *vals) {
  value v = {.set = 1, .s = mooncake_local_hostname()};
  if (v.s == NULL ||
      encache__value_render(&encache__opt_defs[ENCACHE_OPT_LOCAL_HOSTNAME],
                            &v) < 0) {
    encache__value_clear(&v);
    return encache__config_oom(cfg);
  }
  value *host = VAL(vals, LOCAL_HOSTNAME);
  v.warn = host->warn; /* "ignored, as vLLM ignores it" stays */
  host->warn = NULL;
  encache__value_clear(host);
  *host = v;
  return 0;
}
