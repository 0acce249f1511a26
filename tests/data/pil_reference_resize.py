"""The reference of the resize parity test (test_image_resize.cpp): M3AE's
evaluation transform of image files, computed by Pillow as torchvision
applies it (Resize(S, BICUBIC) then CenterCrop(S) on a PIL image).

    python3 pil_reference_resize.py SIZE OUT_DIR IMAGE...

writes OUT_DIR/<image file name>.png: the RGB S x S result, and
OUT_DIR/<image file name>.decoded.png: the image as Pillow decodes it.
"""
import os
import sys

from PIL import Image

BICUBIC = getattr(Image, "Resampling", Image).BICUBIC


def resize_shorter_side(image, size):
    # torchvision.transforms.functional._compute_resized_output_size for an
    # int size: the shorter side becomes size, the longer int(size * long / short).
    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    new_size = (new_short, new_long) if width <= height else (new_long, new_short)
    # torchvision calls Image.resize(size, resample) with reducing_gap=None.
    return image.resize(new_size, BICUBIC)


def center_crop(image, size):
    # torchvision.transforms.functional.center_crop: round() is Python's (half to even).
    width, height = image.size
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def main():
    size, out_dir, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    for path in paths:
        name = os.path.join(out_dir, os.path.basename(path))
        # M3AE's BaseDataset.get_raw_image opens every image as RGBA for its CLIP
        # transforms, and clip_transform converts to RGB after the crop.
        image = Image.open(path).convert("RGBA")
        image.convert("RGB").save(name + ".decoded.png")
        center_crop(resize_shorter_side(image, size), size).convert("RGB").save(name + ".png")


if __name__ == "__main__":
    main()
