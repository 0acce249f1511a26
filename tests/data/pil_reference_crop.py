"""The reference of the crop parity test (test_image_resize.cpp): torchvision's
resized_crop on a PIL image, as RandomResizedCrop applies it once it has
drawn a box: Image.crop((left, top, left + width, top + height)) then
Image.resize((SIZE, SIZE), BICUBIC) (reducing_gap=None, as torchvision calls it).

    python3 pil_reference_crop.py SIZE OUT_DIR IMAGE LEFT TOP WIDTH HEIGHT [IMAGE LEFT ...]

writes OUT_DIR/<image file name>.<left>_<top>_<width>_<height>.png, RGB.
"""
import os
import sys

from PIL import Image

BICUBIC = getattr(Image, "Resampling", Image).BICUBIC


def main():
    size, out_dir, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if len(rest) % 5:
        sys.exit("pil_reference_crop.py: expected IMAGE LEFT TOP WIDTH HEIGHT groups")
    for k in range(0, len(rest), 5):
        path = rest[k]
        left, top, width, height = (int(v) for v in rest[k + 1:k + 5])
        with Image.open(path) as image:
            image = image.convert("RGB")
            crop = image.crop((left, top, left + width, top + height))
            result = crop.resize((size, size), BICUBIC)
        name = "%s.%d_%d_%d_%d.png" % (os.path.basename(path), left, top, width, height)
        result.save(os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
