# SPDX-License-Identifier: Apache-2.0
"""The images of ``python3 -m encache.demo`` and their identifiers.

Either the PNG/JPEG files of a directory, or N distinct images derived
deterministically from the repository's test images (tests/data/images):
flips, rotations, crops and colour shifts of each.  A file that does not
decode is skipped with a message.  Each image is identified as a serving
stack identifies one: by a hash of its decoded pixels (and their shape and
the preprocessing), so equal pixels share an id whatever the file's name.
"""
import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EXTENSIONS = (".png", ".jpg", ".jpeg")
TEST_IMAGES = os.path.join("tests", "data", "images")


@dataclass
class DemoImage:
    name: str            # where it comes from, in words
    pixels: np.ndarray   # H x W x 3, uint8, C-contiguous
    id: str = ""         # the content hash: the item id of the cache


def content_id(pixels, preprocessing):
    """128 bits of sha256 over the shape, the preprocessing and the pixels."""
    h = hashlib.sha256()
    h.update(("%dx%dx%d|%s|" % (*pixels.shape, preprocessing)).encode())
    h.update(pixels.tobytes())
    return h.hexdigest()[:32]


def load_dir(path, say, shown=None):
    """The decodable PNG/JPEG files of path, by name; says what it skips
    (naming path as shown, when given)."""
    from PIL import Image, UnidentifiedImageError

    images = []
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        if not entry.lower().endswith(EXTENSIONS) or not os.path.isfile(full):
            continue
        try:
            with Image.open(full) as im:
                rgb = np.array(im.convert("RGB"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as e:
            why = str(e).replace(full, entry)
            say("skipping %s: not a PNG/JPEG image (%s)"
                % (os.path.join(shown or path, entry), why))
            continue
        images.append(DemoImage(entry, np.ascontiguousarray(rgb)))
    return images


def find_test_images():
    """The repository's tests/data/images, looked for above this file and
    above the current directory, else the copy of its images installed with
    the package (demo_images): (directory, how to name it), or None."""
    starts = [Path(__file__).resolve().parent, Path.cwd().resolve()]
    for start in starts:
        for d in [start, *start.parents]:
            if (d / TEST_IMAGES).is_dir():
                return str(d / TEST_IMAGES), TEST_IMAGES
    installed = Path(__file__).resolve().parent / "demo_images"
    if installed.is_dir():
        return str(installed), "the package's copy of " + TEST_IMAGES
    return None


# The variations, combined per derived image j of a base image.
_COLOURS = [
    ("", lambda a: a),
    ("channels GBR", lambda a: a[..., [1, 2, 0]]),
    ("inverted", lambda a: 255 - a),
    ("brighter", lambda a: np.clip(a.astype(np.int16) + 48, 0, 255)),
    ("channels BRG", lambda a: a[..., [2, 0, 1]]),
    ("warmer", lambda a: np.clip(a.astype(np.int16) + [40, 0, -40], 0, 255)),
]
_CORNERS = ["", "top-left", "top-right", "bottom-left", "bottom-right"]


def _crop(a, j):
    """Crop j of a: none (j % 5 == 0), one of four corners at 80%, and from
    j = 120 on a seeded box of 55% to 95% of each side."""
    h, w = a.shape[:2]
    if j >= 120:
        r = random.Random(j)
        ch, cw = int(h * r.uniform(0.55, 0.95)), int(w * r.uniform(0.55, 0.95))
        y, x = r.randrange(h - ch + 1), r.randrange(w - cw + 1)
        return a[y:y + ch, x:x + cw], "crop %dx%d at %d,%d" % (cw, ch, x, y)
    corner = j % 5
    if corner == 0:
        return a, ""
    ch, cw = max(1, h * 4 // 5), max(1, w * 4 // 5)
    y = 0 if corner in (1, 2) else h - ch
    x = 0 if corner in (1, 3) else w - cw
    return a[y:y + ch, x:x + cw], "crop 80% " + _CORNERS[corner]


def _variant(base, j):
    """The j-th variation of a base image: rotation/flip j % 8, colours
    j % 6 and crop j % 5 (all distinct combinations for j < 120)."""
    a, crop = _crop(base.pixels, j)
    d = j % 8
    a = np.rot90(a, d % 4)
    if d >= 4:
        a = a[:, ::-1]
    colour, shift = _COLOURS[j % 6]
    a = shift(a)
    what = ["rotated %d" % (90 * (d % 4)) if d % 4 else "",
            "flipped" if d >= 4 else "", colour, crop]
    what = ", ".join(w for w in what if w) or "as is"
    pixels = np.ascontiguousarray(a, dtype=np.uint8)
    return DemoImage("%s (%s)" % (base.name, what), pixels)


def derive(bases, n, preprocessing):
    """n distinct images from bases (round robin over them, variation j of
    each in turn); None when they cannot give n distinct ones."""
    out, seen = [], set()
    for i in range(max(64, 64 * n)):
        img = _variant(bases[i % len(bases)], i // len(bases))
        img.id = content_id(img.pixels, preprocessing)
        if img.id not in seen:
            seen.add(img.id)
            out.append(img)
            if len(out) == n:
                return out
    return None


def make_images(arg, preprocessing, say):
    """The image set of --images (a count or a directory): (images, words
    that say where they come from), or (None, why) for a usage error."""
    if not arg.isdigit():
        if not os.path.isdir(arg):
            return None, "--images: %s is neither a number nor a directory" % arg
        images = load_dir(arg, say)
        if not images:
            return None, "--images: %s has no PNG/JPEG image" % arg
        for img in images:
            img.id = content_id(img.pixels, preprocessing)
        distinct = len({img.id for img in images})
        return images, ("the %d PNG/JPEG files of %s (%d distinct)"
                        % (len(images), arg, distinct))
    n = int(arg)
    if n < 1 or n > 10000:
        return None, "--images: a count must be from 1 to 10000"
    found = find_test_images()
    if found is None:
        return None, ("--images %d: the repository's %s was not found above "
                      "this package or the current directory, nor installed "
                      "with it: give --images DIR" % (n, TEST_IMAGES))
    where, label = found
    bases = load_dir(where, say, label)
    if not bases:
        return None, "--images %d: %s has no image" % (n, where)
    images = derive(bases, n, preprocessing)
    if images is None:
        return None, "--images %d: cannot derive so many distinct images" % n
    names = ", ".join(b.name for b in bases)
    return images, ("%d distinct images derived deterministically from the %d "
                    "test images of %s (%s) by flips, rotations, crops and "
                    "colour shifts" % (n, len(bases), label, names))
