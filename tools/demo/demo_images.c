/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo_images.c: the demo's image loader: the PNG and JPEG files of a
 * folder, decoded by stb_image (Debian's libstb-dev) and resized (nearest
 * neighbour) to the demo's input size.  Without stb the demo says so.
 */
#include "demo.h"

#include <stdio.h>

#ifdef ENCACHE_HAVE_STB
#include <dirent.h>
#include <errno.h>
#include <stb/stb_image.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot != NULL && (strcasecmp(dot, ".png") == 0 ||
                         strcasecmp(dot, ".jpg") == 0 ||
                         strcasecmp(dot, ".jpeg") == 0);
}

/* Appends the file at path to set; 0, 1 when skipped, -1 out of memory. */
static int add_file(const char *path, image_set *set, int *cap) {
  int iw, ih, ch;
  unsigned char *px = stbi_load(path, &iw, &ih, &ch, 3);
  if (px == NULL) {
    fprintf(stderr, "encache demo: skipping %s: %s\n", path,
            stbi_failure_reason());
    return 1;
  }
  if (set->n == *cap) {
    int ncap = *cap ? *cap * 2 : 16;
    image *img = realloc(set->img, sizeof(image) * (size_t)ncap);
    if (img == NULL) {
      stbi_image_free(px);
      return -1;
    }
    set->img = img;
    *cap = ncap;
  }
  image *im = &set->img[set->n];
  im->rgb = malloc((size_t)set->side_w * (size_t)set->side_h * 3);
  if (im->rgb == NULL) {
    stbi_image_free(px);
    return -1;
  }
  set->n++;
  for (int y = 0; y < set->side_h; y++)
    for (int x = 0; x < set->side_w; x++)
      memcpy(im->rgb + 3 * (y * set->side_w + x),
             px + 3 * ((y * ih / set->side_h) * iw + x * iw / set->side_w), 3);
  stbi_image_free(px);
  return 0;
}

int demo_images_load(const char *dir, image_set *set) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "encache demo: --images %s: %s\n", dir, strerror(errno));
    return -1;
  }
  struct dirent *e;
  int cap = 0, rc = 0;
  set->n = 0;
  while (rc >= 0 && (e = readdir(d)) != NULL) {
    if (!is_image_name(e->d_name))
      continue;
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    rc = add_file(path, set, &cap);
  }
  closedir(d);
  if (rc < 0) {
    fprintf(stderr, "encache demo: --images %s: out of memory\n", dir);
    return -1;
  }
  if (set->n == 0) {
    fprintf(stderr, "encache demo: --images %s: no PNG or JPEG file\n", dir);
    return -1;
  }
  return 0;
}
#else
int demo_images_load(const char *dir, image_set *set) {
  (void)dir;
  (void)set;
  fprintf(stderr, "encache demo: --images needs encache built with "
                  "libstb-dev\n");
  return -1;
}
#endif
