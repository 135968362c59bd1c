/* SPDX-License-Identifier: Apache-2.0 */
/* encache identity: prints the identity of a model's weights, for
 * embedding_model_identity (encache_model_identity()). */
#include "measure.h"
#include "commands.h"

#include "encache.h"

#include <inttypes.h>
#include <stdio.h>

static const char identity_usage[] =
    "usage: encache identity --model-dir DIR [--label NAME] [--json]\n"
    "\n"
    "Prints an identity for embedding_model_identity that follows the\n"
    "model's weights: NAME@weights:xxh128:HEX, HEX being the XXH3-128\n"
    "digest of the weight files under DIR (*.safetensors, *.bin, *.pt,\n"
    "*.pth, in DIR and its subdirectories; names starting with '.' are\n"
    "left out) with their relative paths and sizes.  New weights under\n"
    "the same model name give a new identity, hence a new namespace: the\n"
    "objects of the old weights simply stop matching.\n"
    "\n"
    "  --model-dir DIR  the model's directory (required)\n"
    "  --label NAME     the identity's name: letters, digits, '.', '_',\n"
    "                   '-' and '/', at most 128 bytes (default: DIR's\n"
    "                   name, other characters replaced by '_')\n"
    "  --json           print the identity, the files and bytes hashed,\n"
    "                   the time taken and the throughput as JSON\n"
    "\n"
    "Exit status: 0 printed; 1 DIR or a weight file cannot be read, DIR\n"
    "holds no weight file, or a file changed while it was read; 2 bad\n"
    "usage (no --model-dir, a bad label).\n";

enum { ID_MODEL_DIR, ID_LABEL };

static const tool_opt identity_opts[] = {
    [ID_MODEL_DIR] = {"model-dir", 1}, [ID_LABEL] = {"label", 1}, {NULL, 0}};

static int run_identity(const tool_globals *g, const tool_args *a) {
  const char *dir = a->val[ID_MODEL_DIR];
  if (dir == NULL || dir[0] == '\0')
    return usage_error("identity", "--model-dir is required and must not be "
                                   "empty");
  char id[ENCACHE_MODEL_IDENTITY_MAX];
  encache_identity_info info = ENCACHE_IDENTITY_INFO_INIT;
  double t0 = measure_now();
  int rc = encache_model_identity(dir, a->val[ID_LABEL], id, sizeof(id),
                                  &info);
  double secs = measure_now() - t0;
  if (rc < 0) {
    fprintf(stderr, "encache identity: %s\n", encache_errmsg(NULL));
    return rc == ENCACHE_EINVAL ? EXIT_USAGE : EXIT_FAIL;
  }
  if (!g->json) {
    puts(id);
    return EXIT_OK;
  }
  /* The identity needs no JSON escaping: its characters are letters,
   * digits and ".@:_-/" only. */
  printf("{\"identity\": \"%s\", \"files\": %" PRIu64 ", \"bytes\": %" PRIu64
         ", \"seconds\": %.6f, \"gb_per_s\": %.3f}\n",
         id, info.files, info.bytes, secs,
         measure_gbs((double)info.bytes, secs));
  return EXIT_OK;
}

const tool_command cmd_identity = {
    "identity", "print an identity that follows a model's weights",
    identity_usage, identity_opts, TOOL_JSON, 0, 0, "no argument",
    run_identity};
